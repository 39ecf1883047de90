"""docker/compose.yaml: no Docker engine runs here, so every service's command is run as it stands
(same arguments and environment), with host names and ports mapped onto loopback."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class MissingVariable(Exception):
    pass


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR:-default} and ${VAR:?error} (unset or empty: compose refuses to start)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise MissingVariable(f"{name}: {arg}")
        return arg

    return re.sub(r"\$\{(\w+)(:-|:\?)([^}]*)\}", one, value)


def test_compose_refuses_to_start_without_a_secret() -> None:
    """No default secret gets around the daemons' refusal to listen beyond loopback without one."""
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    for svc in spec["services"].values():
        value = svc["environment"]["TENSORWIRE_SECRET"]
        with pytest.raises(MissingVariable, match="TENSORWIRE_SECRET"):
            _interpolate(value, {})
        with pytest.raises(MissingVariable):
            _interpolate(value, {"TENSORWIRE_SECRET": ""})
        assert _interpolate(value, {"TENSORWIRE_SECRET": "s3cret"}) == "s3cret"


def test_compose_file_declares_real_daemons() -> None:
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    services = spec["services"]
    assert set(services) == {"ps", "worker0", "worker1"}
    for name, svc in services.items():
        assert svc["command"][0] in ("tensorwire-ps", "tensorwire-worker")
        assert "tcp" in svc["command"][svc["command"].index("--transport") + 1]
        assert svc["environment"]["TENSORWIRE_SECRET"], name
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert "pip install '.[ps]'" in dockerfile and "USER tensorwire" in dockerfile


def test_compose_services_run_locally(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    services: dict[str, Any] = spec["services"]
    hosts = {svc.get("hostname", name) for name, svc in services.items()}
    ports: dict[tuple[str, str], int] = {}

    def local(service: str, arg: str) -> str:
        def endpoint(m: re.Match[str]) -> str:
            host, port = m.group(1), m.group(2)
            owner = service if host == "0.0.0.0" else host
            return f"tcp://127.0.0.1:{ports.setdefault((owner, port), free_port())}"

        arg = re.sub(r"tcp://([\w.]+):(\d+)", endpoint, arg)
        arg = arg.replace("/data", str(tmp_path))
        return "127.0.0.1" if arg in hosts else arg

    outer = {**os.environ, "TENSORWIRE_SECRET": secrets.token_hex(16)}  # as the README says
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        for name, svc in services.items():
            cmd = [str(BIN / svc["command"][0])] + [local(name, a) for a in svc["command"][1:]]
            if name.startswith("worker"):
                cmd += ["--metrics", str(tmp_path / f"{name}.json")]
            declared = svc["environment"].items()
            env = {**os.environ, **{k: _interpolate(v, outer) for k, v in declared}}
            log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
            procs.append((name, subprocess.Popen(cmd, env=env, stdout=log, stderr=log, text=True)))
            log.close()
            time.sleep(0.2)  # compose's depends_on: the server first
        codes = {name: p.wait(120) for name, p in procs}
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = {name: (tmp_path / f"{name}.log").read_text() for name, _ in procs}
    assert codes == {name: 0 for name, _ in procs}, logs
    assert "over tcp" in logs["ps"]
    metrics = json.loads((tmp_path / "worker0.json").read_text())
    assert metrics["steps"] == 300 and metrics["test_accuracy"] >= 0.95
    assert (tmp_path / "checkpoints" / "ps-shard0.npz").exists()
