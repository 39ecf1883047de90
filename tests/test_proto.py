"""The committed protobuf modules of the gRPC baseline match what `make proto` generates now."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.grpc  # grpc_tools, of the dev install

ROOT = Path(__file__).resolve().parent.parent
PROTO = "tensorwire/transports/tensor_service.proto"
GENERATED = ["tensor_service_pb2.py", "tensor_service_pb2_grpc.py", "tensor_service_pb2.pyi"]


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    (tmp_path / "tensorwire/transports").mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--grpc_python_out=.",
            "--pyi_out=.",
            PROTO,
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "tensorwire/transports" / name).read_text()
        committed = (ROOT / "tensorwire/transports" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make proto` and commit the result"
