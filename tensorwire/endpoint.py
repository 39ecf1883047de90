"""Control-plane endpoints: the ``tcp://HOST:PORT`` form every receiver, sender and daemon uses."""

from __future__ import annotations

from urllib.parse import urlsplit


def split_endpoint(text: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``tcp://HOST:PORT``, or None when ``text`` is not one (another scheme,
    no host, no port or a port that is not a number). Port 0 is returned as 0: a bind may mean
    "any free port", an address to connect to may not."""
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None
    if parts.scheme != "tcp" or not host or port is None:
        return None
    return host, port
