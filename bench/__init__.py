"""Benchmarks of tensorwire against gRPC, a hand-written pyzmq loop, a raw socket and memcpy.

``tensorwire bench`` (or ``python -m tensorwire.bench``) is the entry point; see :mod:`.cli`.
Everything here uses only the public API of :mod:`tensorwire`.
"""
