"""Shared-secret authentication of the control-plane hello (HMAC-SHA256 challenge-response).

The sender sends a nonce in its hello; the receiver answers with a nonce of its own; the sender
proves it knows the secret with ``HMAC(secret, "client" | server nonce | client nonce)`` and the
receiver proves the same back with the roles swapped, so neither side hands memory addresses to,
or writes tensors into, a peer that does not hold the secret. Nonces make replays useless.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

NONCE_BYTES = 16


def normalise_secret(secret: str | bytes | None) -> bytes | None:
    if secret is None:
        return None
    if not isinstance(secret, (str, bytes, bytearray, memoryview)):
        # bytes() of an int is that many zero bytes: secret=16 was sixteen of them
        raise TypeError(f"secret must be a str or bytes, got {type(secret).__name__}")
    value = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not value:
        raise ValueError("secret must not be empty")
    return value


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def client_mac(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"client" + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"server" + server_nonce + client_nonce, hashlib.sha256).digest()


def verify(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)
