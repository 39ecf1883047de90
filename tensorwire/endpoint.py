"""Control-plane endpoints: the ``tcp://HOST:PORT`` form every receiver, sender and daemon uses.

HOST is a name, an IPv4 address or an IPv6 address in brackets (``tcp://[::1]:5555``, as in a
URL); :func:`host_port` writes an address back in the form sockets and gRPC take.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from urllib.parse import urlsplit

from .errors import TensorWireError


def split_endpoint(text: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``tcp://HOST:PORT``, or None when ``text`` is not one (another scheme,
    no host, no port or a port that is not a number). Port 0 is returned as 0: a bind may mean
    "any free port", an address to connect to may not. An IPv6 host comes without its
    brackets."""
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None
    if parts.scheme != "tcp" or not host or port is None:
        return None
    return host, port


def ipv6_hint(text: str) -> str:
    """What to say of a refused endpoint that looks like an IPv6 address without its brackets
    (``tcp://::1:5555``, which no reader can split); "" for any other."""
    rest = text.split("://", 1)[-1]
    if rest.count(":") > 1 and not rest.startswith("["):
        return " (an IPv6 address goes in brackets: tcp://[::1]:5555)"
    return ""


def endpoint_host(text: str) -> str:
    """The host of ``tcp://HOST:PORT`` (an IPv6 one without its brackets); TensorWireError names
    ``text`` when it is not one."""
    split = split_endpoint(text)
    if split is None:
        raise TensorWireError(f"{text!r} is not an address: use tcp://HOST:PORT{ipv6_hint(text)}")
    return split[0]


def is_ipv6(host: str) -> bool:
    """Is ``host`` an IPv6 address (no name is: resolving one is left to the connect)?"""
    return ":" in host


#: Bind hosts that mean every interface: ZeroMQ's ``*``, IPv4's ``0.0.0.0``, IPv6's ``::``
#: (which listens on IPv4 too, see :func:`listener`).
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::"})


#: Names found to resolve to IPv6 addresses alone (kept: such a name's family does not change
#: while a process runs; a failed lookup is not kept, so a name not yet in DNS, as a pod's
#: peers' are while a job starts, is looked up again).
_IPV6_ONLY: dict[str, bool] = {}


def reached_over_ipv6(host: str) -> bool:
    """Is ``host`` reached over IPv6: an IPv6 address, or a name that resolves to IPv6 addresses
    alone (an IPv6-only cluster's DNS)? A name with an IPv4 address is reached over IPv4, as
    ZeroMQ does by default (``localhost`` resolves to ``::1`` first, and a receiver bound to
    ``127.0.0.1`` would not be found there). Before, such a name was never reached."""
    host = host.strip("[]")
    if is_ipv6(host):
        return True
    if not host or host in WILDCARD_HOSTS:
        return False
    try:
        ipaddress.ip_address(host)
        return False  # an IPv4 address
    except ValueError:
        pass
    known = _IPV6_ONLY.get(host)
    if known is None:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return False  # the connect says why
        known = _IPV6_ONLY[host] = {info[0] for info in infos} == {socket.AF_INET6}
    return known


def is_ipv6_endpoint(text: str) -> bool:
    """Is ``text`` a ``tcp://HOST:PORT`` endpoint reached over IPv6 (:func:`reached_over_ipv6`)?"""
    split = split_endpoint(text)
    return split is not None and reached_over_ipv6(split[0])


def is_loopback_host(host: str) -> bool:
    """Is ``host`` (a name or an address) this machine's loopback?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unresolvable_host(host: str) -> str | None:
    """Why ``host`` (a name, an address, a wildcard) names no address here, or None: a name the
    resolver does not know. Asked before anything else is made of a bind host, so that what
    follows (the secret a non-loopback bind needs) is not blamed instead."""
    host = host.strip("[]")
    if is_wildcard_host(host) or host == "localhost":
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return f"{host!r} resolves to no address here ({getattr(exc, 'strerror', None) or exc})"
    return None


def is_wildcard_host(host: str | None) -> bool:
    """Does a bind host (or a receiver's advertised one) name every interface rather than an
    address a peer can reach? An empty or missing host counts as one."""
    return not host or host.strip("[]") in WILDCARD_HOSTS


def socket_host(host: str) -> str:
    """A bind host as a socket takes it: ZeroMQ's ``*`` is IPv4's ``0.0.0.0``."""
    return "0.0.0.0" if host == "*" else host


def loopback_for(host: str) -> str:
    """This machine's loopback address in ``host``'s family (for a wildcard-bound server's
    own URL: ``::`` is reached at ``::1``, anything else at ``127.0.0.1``)."""
    return "::1" if is_ipv6(host.strip("[]")) else "127.0.0.1"


def family(host: str) -> socket.AddressFamily:
    """The socket family ``host`` is reached (or bound) over: :func:`reached_over_ipv6`."""
    return socket.AF_INET6 if reached_over_ipv6(host) else socket.AF_INET


def listener(host: str, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on a free port of ``host``, in its family; ``::`` takes IPv4
    too, as the control plane's and gRPC's ports bound there do."""
    return socket.create_server(
        (host, 0), family=family(host), backlog=backlog, dualstack_ipv6=host == "::"
    )


def bracketed(host: str) -> str:
    """``host``, an IPv6 one in brackets, as it goes before ``:PORT``."""
    return f"[{host}]" if is_ipv6(host) else host


def host_port(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (``[::1]:5555``)."""
    return f"{bracketed(host)}:{port}"


def local_address_towards(host: str) -> str:
    """The address of this machine that ``host`` reaches it at: loopback for loopback, else the
    address of the interface the route to ``host`` leaves by (a UDP connect picks it; no packet
    is sent)."""
    if is_loopback_host(host):
        return loopback_for(host)
    with socket.socket(family(host), socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return str(s.getsockname()[0])


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://HOST:PORT``, an IPv6 host in brackets."""
    return f"tcp://{host_port(host, port)}"


#: The length of ZMTP's signature, the first bytes a ZeroMQ peer sends (RFC 23/ZMTP)
ZMTP_SIGNATURE_BYTES = 10


def zeromq_greeting_problem(host_port: tuple[str, int], timeout: float) -> str | None:
    """None if something at ``host_port`` accepts a connection and greets it as a ZeroMQ socket
    does (a tensorwire daemon's control plane, a `bench serve`) within ``timeout`` seconds;
    else what went wrong, in words. The kernel accepts for a stopped process too: only the
    greeting says the process runs."""
    deadline = time.monotonic() + timeout
    greeting = b""
    try:
        with socket.create_connection(host_port, timeout=timeout) as conn:
            # ZMTP's signature: 0xFF, eight bytes, 0x7F, sent by the peer's I/O thread as it
            # accepts (libzmq sends it before the other end says anything)
            while len(greeting) < ZMTP_SIGNATURE_BYTES:
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = conn.recv(ZMTP_SIGNATURE_BYTES - len(greeting))
                if not chunk:
                    break
                greeting += chunk
    except TimeoutError:
        return (
            f"accepted the connection but sent no greeting within {timeout:g} s: is the process "
            "stopped (frozen), or is this port another service's?"
        )
    except OSError as exc:
        return str(exc.strerror or exc)
    if len(greeting) < ZMTP_SIGNATURE_BYTES or greeting[0] != 0xFF or greeting[-1] != 0x7F:
        return (
            f"the service there is not a tensorwire one (it answered {greeting[:16]!r}, not "
            "ZeroMQ's greeting)"
        )
    return None
