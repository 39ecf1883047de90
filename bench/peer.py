"""The far side of a benchmark: ``tensorwire bench serve``.

It owns everything that receives: a tensorwire :class:`~tensorwire.Receiver` (every transport
writes into it), a raw TCP sink that does nothing but ``recv_into`` one buffer (the limit of any TCP
path), and a pyzmq PAIR socket (what a Python user would write by hand). A runner drives it over a
zmq REQ/REP command socket with msgpack commands; each command is answered when its work is done.
One runner at a time; between runners everything is set up afresh.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import zmq

import tensorwire as tw
from tensorwire.auth import new_nonce, verify
from tensorwire.endpoint import (
    bracketed,
    endpoint_host,
    is_loopback_host,
    listener,
    local_address_towards,
    reached_over_ipv6,
    tcp_endpoint,
)

from .common import (
    BATCH_MAX_BYTES,
    MiB,
    batch_tensor_names,
    command_mac,
    machine_facts,
    raw_recv,
    tensor_name,
    tune_socket,
)
from .gloo import PEER, Gloo
from .gloo import available as gloo_available
from .raw_nixl import RawNixl

log = logging.getLogger(__name__)


class _Session:
    """What one runner set up: tensors, echo senders, the raw and zmq sinks."""

    def __init__(self, host: str, setup: dict[str, Any], secret: str | None) -> None:
        self.secret = secret
        self.sizes: list[int] = setup["sizes"]
        self.transports: list[str] = setup["transports"]
        self.latency_bytes: int = setup["latency_bytes"]
        self.rx = tw.Receiver(
            tcp_endpoint(host, 0),
            ring=setup.get("ring"),
            secret=secret,
            shm=setup.get("shm"),
        )
        #: the receiver's slots are in /dev/shm (raw NIXL's buffer is then there too)
        self.shared_memory = setup.get("shm") is not False
        self.senders: dict[str, tw.Sender] = {}
        self.raw_listener = listener(host)
        self.raw: socket.socket | None = None
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pair = self.ctx.socket(zmq.PAIR)
        self.pair.linger = 0
        self.pair.ipv6 = reached_over_ipv6(host)
        self.pair_port = self.pair.bind_to_random_port(f"tcp://{bracketed(host)}")
        self.buffer = np.empty(max([*self.sizes, self.latency_bytes]), dtype=np.uint8)
        self.host = host
        self.raw_nixl: RawNixl | None = None
        self.device = device = setup.get("device", "cpu")  # where the tensors live (--device)
        self.gloo: Gloo | None = None
        self.gloo_slots: dict[int, list[np.ndarray[Any, Any]]] = {}
        #: why this end cannot take part in the gloo reference (asked only where it is measured:
        #: the check imports torch)
        self.gloo_problem = gloo_available(device) if setup.get("gloo") else None
        for t in self.transports:
            for size in self.sizes:
                self.rx.register(tensor_name(t, size), (size,), "uint8", device=device)
            self.rx.register(tensor_name(t, "ping"), (self.latency_bytes,), "uint8", device=device)
            for size in (s for s in self.sizes if s <= BATCH_MAX_BYTES):
                for name in batch_tensor_names(t, size, setup.get("batch", 0)):
                    self.rx.register(name, (size,), "uint8", device=device)

    def info(self) -> dict[str, Any]:
        return {
            "receiver": self.rx.address,
            "raw_port": self.raw_listener.getsockname()[1],
            "zmq_port": self.pair_port,
            "gloo": self.gloo_problem,
        }

    def connect_pong(self, address: str, transports: list[str]) -> None:
        for t in transports:
            self.senders[t] = tw.Sender.connect(
                address, transport=t, timeout=60, secret=self.secret
            )

    # -- the work ----------------------------------------------------------------------------

    def consume(self, name: str, count: int) -> None:
        for _ in range(count):
            self.rx.wait(name, timeout=120)
            self.rx.release(name)

    def consume_batch(self, names: list[str], count: int) -> None:
        """``count`` batches: each one message of each of ``names``, taken and released
        together."""
        for _ in range(count):
            self.rx.wait_all(names, timeout=120)
            self.rx.release_many(names)

    def echo(self, transport: str, count: int) -> None:
        ping, pong = tensor_name(transport, "ping"), tensor_name(transport, "pong")
        tx = self.senders[transport]
        for _ in range(count):
            view = self.rx.wait(ping, timeout=120)
            tx.write(pong, view)
            self.rx.release(ping)

    def _raw_socket(self) -> socket.socket:
        if self.raw is None:
            self.raw_listener.settimeout(30)
            self.raw, _ = self.raw_listener.accept()
            self.raw.settimeout(None)
            tune_socket(self.raw)
        return self.raw

    def raw_sink(self, size: int, count: int) -> None:
        sock = self._raw_socket()
        view = self.buffer[:size].data
        for _ in range(count):
            raw_recv(sock, view)
        sock.sendall(b"k")

    def raw_echo(self, size: int, count: int) -> None:
        """The round trip's far end over a plain socket: each ping is received into our
        buffer and sent back from it."""
        sock = self._raw_socket()
        view = self.buffer[:size].data
        for _ in range(count):
            raw_recv(sock, view)
            sock.sendall(view)

    def raw_nixl_setup(self, details: dict[str, Any]) -> dict[str, Any]:
        if self.raw_nixl is None:
            nbytes = max([*self.sizes, self.latency_bytes])
            self.raw_nixl = RawNixl(
                "peer", nbytes, is_loopback_host(self.host), self.device, self.shared_memory
            )
            self.raw_nixl.connect(details)
        return {"details": self.raw_nixl.details()}

    def gloo_setup(self, host: str, port: int) -> None:
        """Join the runner's gloo process group (its store at ``host:port``; our pairs on our
        own address towards it, which the runner reaches)."""
        if self.gloo is not None:
            self.gloo.close()
            self.gloo = None
        self.gloo = Gloo(PEER, local_address_towards(host), port, store_host=host)

    def gloo_sink(self, size: int, count: int, window: int) -> None:
        """``count`` receives into our buffer, each waited for; or (``window``) pipelined
        into that many buffers of the size (kept for the session, as a receiver's slots)."""
        assert self.gloo is not None, "gloo-setup first"
        if not window:
            self.gloo.recv(self.buffer[:size], count)
            return
        slots = self.gloo_slots.get(size)
        if slots is None or len(slots) != window:
            slots = self.gloo_slots[size] = list(np.empty((window, size), dtype=np.uint8))
        self.gloo.recv_pipelined(slots, count)

    def gloo_echo(self, size: int, count: int) -> None:
        assert self.gloo is not None, "gloo-setup first"
        self.gloo.echo(self.buffer[:size], count)

    def zmq_sink(self, size: int, count: int, echo: bool) -> None:
        dst = self.buffer[:size]
        for _ in range(count):
            frame = self.pair.recv(copy=False)
            np.copyto(dst, np.frombuffer(frame.buffer, dtype=np.uint8))  # into "our" buffer
            if echo:
                self.pair.send(dst.data, copy=False)
        if not echo:
            self.pair.send(b"k")

    def close(self) -> None:
        for tx in self.senders.values():
            tx.close()
        if self.raw_nixl is not None:
            self.raw_nixl.close()
        if self.gloo is not None:
            self.gloo.close()
        if self.raw is not None:
            self.raw.close()
        self.raw_listener.close()
        self.pair.close()
        self.ctx.term()
        self.rx.close()


def serve(
    bind: str,
    ready: Any = None,
    once: bool = False,
    secret: str | None = None,
    started: Callable[[], object] | None = None,
) -> None:
    """Answer runners' commands on ``bind`` (a ``tcp://HOST:PORT`` zmq endpoint).

    ``ready`` (a pipe end) receives the bound address; ``once`` stops after the first runner.
    ``started`` is called once everything it opened will be closed however it ends (the CLI
    lets Ctrl-C in from there).
    """
    host = endpoint_host(bind)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.linger = 0
    rep.ipv6 = reached_over_ipv6(host)
    try:
        rep.bind(bind)
    except zmq.ZMQError as exc:
        rep.close()
        ctx.term()
        raise tw.TensorWireError(f"cannot bind the benchmark server to {bind}: {exc}") from exc
    address = rep.getsockopt_string(zmq.LAST_ENDPOINT)
    if ready is not None:
        ready.send(address)
    else:
        print(f"tensorwire bench serving on {address} (Ctrl-C to stop)", flush=True)
    session: _Session | None = None
    nonce, counter = b"", 0  # (with a secret) the runner's since its hello, and its commands
    # The nonce of the latest hello, which becomes the runner's only once a command proves the
    # secret under it: a hello is unauthenticated (it is how a runner learns a nonce), so one
    # from anyone must not end the numbering of the runner being served.
    pending = b""
    try:
        if started is not None:
            started()
        while True:
            raw = rep.recv()
            try:
                try:
                    cmd = _decode(raw, secret, nonce, counter)
                except _Refused:
                    if not pending:
                        raise
                    cmd = _decode(raw, secret, pending, 0)  # a new runner's first command
                    if cmd.get("op") != "hello":
                        nonce, counter, pending = pending, 0, b""
            except _Refused as exc:  # garbage, or a command without the secret's proof
                rep.send(msgpack.packb({"ok": False, "error": str(exc)}))
                continue
            op = cmd.get("op")
            if op == "hello":
                pending = new_nonce() if secret else b""
            elif secret:
                counter += 1
            reply: dict[str, Any] = {"ok": True}
            try:
                if op == "hello":
                    reply.update(machine=machine_facts(), nonce=pending)
                elif op == "setup":
                    if session is not None:
                        session.close()
                    session = _Session(host, cmd, secret)
                    reply.update(session.info())
                elif op == "pong":
                    assert session is not None
                    session.connect_pong(cmd["address"], cmd["transports"])
                elif op == "consume":
                    assert session is not None
                    session.consume(cmd["name"], cmd["count"])
                elif op == "consume-batch":
                    assert session is not None
                    session.consume_batch(cmd["names"], cmd["count"])
                elif op == "echo":
                    assert session is not None
                    session.echo(cmd["transport"], cmd["count"])
                elif op == "raw":
                    assert session is not None
                    session.raw_sink(cmd["size"], cmd["count"])
                elif op == "raw-echo":
                    assert session is not None
                    session.raw_echo(cmd["size"], cmd["count"])
                elif op == "raw-nixl-setup":
                    assert session is not None
                    reply.update(session.raw_nixl_setup(cmd["details"]))
                elif op == "raw-nixl":
                    assert session is not None and session.raw_nixl is not None
                    session.raw_nixl.sink()
                elif op == "raw-nixl-echo":
                    assert session is not None and session.raw_nixl is not None
                    session.raw_nixl.echo(cmd["size"], cmd["count"])
                elif op == "gloo-setup":
                    assert session is not None
                    session.gloo_setup(cmd["host"], cmd["port"])
                elif op == "gloo":
                    assert session is not None
                    session.gloo_sink(cmd["size"], cmd["count"], cmd.get("window", 0))
                elif op == "gloo-echo":
                    assert session is not None
                    session.gloo_echo(cmd["size"], cmd["count"])
                elif op == "zmq":
                    assert session is not None
                    session.zmq_sink(cmd["size"], cmd["count"], cmd.get("echo", False))
                elif op in ("bye", "shutdown"):
                    if session is not None:
                        session.close()
                        session = None
                else:
                    reply = {"ok": False, "error": f"unknown command {op!r}"}
            except Exception as exc:  # a command that fails: said to the runner, served on
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            rep.send(msgpack.packb(reply))
            if op == "shutdown" or (op == "bye" and once):
                return
    finally:
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()
        rep.close()
        ctx.term()


class _Refused(Exception):
    """A message that is not a command this server takes (said to the sender, then ignored)."""


def _decode(raw: bytes, secret: str | None, nonce: bytes, counter: int) -> dict[str, Any]:
    """The command in ``raw``. With a secret, every command but ``hello`` (which offers a new
    ``nonce``: a runner's numbering starts under it with its first proven command) comes as
    ``[body, mac]`` and must carry the proof of the secret for its number since that hello
    (``command_mac``): whoever can reach the port cannot make this server set anything up,
    allocate or stop without it. Before, one undecodable message ended the server with a
    traceback."""
    try:
        msg = msgpack.unpackb(raw)
    except Exception as exc:  # msgpack raises several kinds on garbage
        raise _Refused(f"not a command ({type(exc).__name__})") from None
    if isinstance(msg, dict) and msg.get("op") == "hello":
        return msg
    if secret is not None:
        if not nonce:
            raise _Refused("say hello first")
        if not (isinstance(msg, list) and len(msg) == 2 and all(type(x) is bytes for x in msg)):
            raise _Refused(
                "this benchmark server needs the shared secret (--secret-file or "
                "TENSORWIRE_SECRET, the same on both ends)"
            )
        body, mac = msg
        if not verify(command_mac(secret, nonce, counter, body), mac):
            raise _Refused(
                "the command does not prove the shared secret (another secret, or a replay)"
            )
        try:
            msg = msgpack.unpackb(body)
        except Exception as exc:
            raise _Refused(f"not a command ({type(exc).__name__})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise _Refused("a command is a map with an 'op'")
    return msg


__all__ = ["MiB", "serve"]
