"""Optional dependencies: which extra of ``pip install tensorwire[...]`` brings what, and the
one-line error a user gets when a feature needs one that is missing.

The core (numpy, pyzmq, msgpack, ml_dtypes) moves tensors over ``shm``, ``tcp`` and ``nixl``. The
gRPC baseline, the parameter-server demo's data set and the benchmark's tables and plots are
extras, imported only by the code that needs them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .errors import MissingDependencyError


@dataclass(frozen=True)
class Extra:
    name: str  # as in pip install 'tensorwire[<name>]'
    module: str  # what it makes importable
    gives: str  # what for, in a user's words


GRPC = Extra("grpc", "grpc", "the gRPC baseline transports (grpc, grpc-stream)")
PS = Extra("ps", "sklearn", "the digits data set of the parameter-server demo")
BENCH_PLOTS = Extra("bench", "matplotlib", "benchmark plots")
METRICS = Extra("metrics", "prometheus_client", "serving Prometheus metrics")
RICH = Extra("metrics", "rich", "live terminal views")
RAY = Extra("ray", "ray", "launching jobs on a Ray cluster")


def installed(extra: Extra) -> bool:
    """Is ``extra``'s module importable (checked without importing it)?"""
    try:
        return importlib.util.find_spec(extra.module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: Extra, for_what: str = "") -> None:
    """Raise :class:`MissingDependencyError` unless ``extra`` is installed."""
    if not installed(extra):
        what = for_what or extra.gives
        raise MissingDependencyError(
            f"{what} needs the '{extra.name}' extra ({extra.module} is not installed): "
            f"pip install 'tensorwire[{extra.name}]'"
        )
