"""Network namespaces for the tests that need separate hosts on this machine: created by the test,
joined by veth links, and removed afterwards with every process still running inside them, even
when the test fails. Needs root and iproute2 (the tests skip, with the reason, without them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest


def ip(*args: str) -> str:
    return subprocess.run(
        ["ip", *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


@contextlib.contextmanager
def namespaces(
    tag: str,
    names: list[str],
    links: list[tuple[str, str, str, str]],
    hosts: str | None = None,
) -> Iterator[dict[str, str]]:
    """Namespaces ``tag + name`` for each name, with loopback up, and one veth pair per link
    ``(name_a, address_a/prefix, name_b, address_b/prefix)``. Yields name -> namespace.
    ``hosts``: the ``/etc/hosts`` of processes run with ``ip netns exec`` in each (which mounts
    ``/etc/netns/NAMESPACE/hosts`` over it), removed with the namespaces."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    made = {name: f"{tag}{name}" for name in names}
    created: list[str] = []
    try:
        for ns in made.values():
            try:
                ip("netns", "add", ns)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot create a network namespace here: {exc.stderr.strip()}")
            created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
            if hosts is not None:
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                with open(f"/etc/netns/{ns}/hosts", "w") as f:
                    f.write(hosts)
        for k, (a, addr_a, b, addr_b) in enumerate(links):
            va, vb = f"{tag}v{k}a", f"{tag}v{k}b"
            ip("link", "add", va, "type", "veth", "peer", "name", vb)
            for name, dev, addr in ((a, va, addr_a), (b, vb, addr_b)):
                ip("link", "set", dev, "netns", made[name])
                ip("-n", made[name], "addr", "add", addr, "dev", dev)
                ip("-n", made[name], "link", "set", dev, "up")
        yield made
    finally:
        for ns in created:
            kill_everything_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            if hosts is not None:
                shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def kill_everything_in(ns: str, grace: float = 5.0) -> None:
    """SIGTERM every process in namespace ``ns``, SIGKILL what is left after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        pids = _pids(ns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while _pids(ns) and time.monotonic() < deadline:
            time.sleep(0.1)


def _pids(ns: str) -> list[int]:
    try:
        return [int(p) for p in ip("netns", "pids", ns).split()]
    except subprocess.CalledProcessError:
        return []
