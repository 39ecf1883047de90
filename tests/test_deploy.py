"""docker/compose.yaml: no Docker engine runs here, so every service's command is run as it stands
(same arguments and environment), with host names and ports mapped onto loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _interpolate(value: str) -> str:
    """Compose's ${VAR:-default}."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1), m.group(2)), value)


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

    procs: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        for name, svc in services.items():
            cmd = [str(BIN / svc["command"][0])] + [local(name, a) for a in svc["command"][1:]]
            if name.startswith("worker"):
                cmd += ["--metrics", str(tmp_path / f"{name}.json")]
            env = {**os.environ, **{k: _interpolate(v) for k, v in svc["environment"].items()}}
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
