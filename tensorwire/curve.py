"""Optional encryption of the control plane with ZeroMQ CURVE.

A job shares one CURVE key pair: every receiver serves its control plane with the secret key, and
every sender connects with the public key (and a throw-away key pair of its own), so control traffic
(hellos, address books, tokens) is encrypted and a sender knows it talks to a key holder. Peers are
still authenticated by the shared-secret HMAC hello; the data plane is not encrypted.

``tensorwire keys DIR`` writes ``DIR/server.key`` (public, for senders) and
``DIR/server.key_secret`` (for receivers) with pyzmq's certificate tools.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import zmq
import zmq.auth

from .errors import TensorWireError

NAME = "server"


@dataclass(frozen=True)
class CurveKeys:
    public: bytes
    secret: bytes | None  # None on a sender, which holds only the public key


def available() -> bool:
    return bool(zmq.has("curve"))


def generate(directory: str, *, overwrite: bool = False) -> tuple[str, str]:
    """Write a new key pair into ``directory``; return (public file, secret file). An existing
    pair is kept (TensorWireError) unless ``overwrite``: replacing it locks out every host that
    holds the old public key."""
    if not available():
        raise TensorWireError("this libzmq has no CURVE support")
    existing = [
        path
        for path in (
            os.path.join(directory, f"{NAME}.key"),
            os.path.join(directory, f"{NAME}.key_secret"),
        )
        if os.path.exists(path)
    ]
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise TensorWireError(f"{directory} exists and is not a directory")
    if existing and not overwrite:
        raise TensorWireError(
            f"{directory} already holds a key pair ({', '.join(existing)}); pass --force to "
            "replace it (every host of the job then needs the new one)"
        )
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # Made in a directory of this user's alone inside ``directory`` and moved out: pyzmq writes
    # a key file with the umask's mode (0644 as a rule), so where ``directory`` was already
    # open to other users, the secret key was readable by them until its chmod. Moved, each
    # file arrives whole and with its final mode, also over an old pair.
    try:
        staging = tempfile.mkdtemp(prefix=".tensorwire-keys-", dir=directory)
    except OSError as exc:  # (named by the directory given, not by the staging one's name)
        raise OSError(exc.errno, exc.strerror, directory) from exc
    try:
        made_public, made_secret = zmq.auth.create_certificates(staging, NAME)
        os.chmod(made_secret, 0o600)
        public = os.path.join(directory, f"{NAME}.key")
        secret = os.path.join(directory, f"{NAME}.key_secret")
        os.replace(made_secret, secret)
        os.replace(made_public, public)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return public, secret


def load(directory: str) -> CurveKeys:
    """The job's keys from ``directory``: the secret key too when it is there (receivers)."""
    if not available():
        raise TensorWireError("this libzmq has no CURVE support")
    secret_file = os.path.join(directory, f"{NAME}.key_secret")
    public_file = os.path.join(directory, f"{NAME}.key")
    try:
        if os.path.exists(secret_file):
            public, secret = zmq.auth.load_certificate(secret_file)
            return CurveKeys(public, secret)
        public, _ = zmq.auth.load_certificate(public_file)
    except (OSError, ValueError) as exc:
        raise TensorWireError(f"cannot read CURVE keys in {directory}: {exc}") from exc
    return CurveKeys(public, None)


def serve(sock: zmq.Socket[bytes], keys: CurveKeys) -> None:
    if keys.secret is None:
        raise TensorWireError("a receiver needs the CURVE secret key (server.key_secret)")
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True


def connect(sock: zmq.Socket[bytes], server_public: bytes) -> None:
    public, secret = zmq.curve_keypair()
    try:
        sock.curve_serverkey = server_public
    except zmq.ZMQError as exc:
        raise TensorWireError(f"not a CURVE public key: {server_public!r:.60}") from exc
    sock.curve_publickey = public
    sock.curve_secretkey = secret
