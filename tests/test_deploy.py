"""docker/compose.yaml: no Docker engine runs here, so every service's command is run as it stands
(same arguments and environment), with host names and ports mapped onto loopback."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import free_port
from .jobs import Processes

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


def _daemons(spec: dict[str, Any]) -> dict[str, Any]:
    """The compose file's tensorwire services (not the monitoring profile's)."""
    return {
        name: svc
        for name, svc in spec["services"].items()
        if str(svc.get("command", [""])[0]).startswith("tensorwire")
    }


def test_compose_refuses_to_start_without_a_secret() -> None:
    """No default secret gets around the daemons' refusal to listen beyond loopback without one."""
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    for svc in _daemons(spec).values():
        value = svc["environment"]["TENSORWIRE_SECRET"]
        with pytest.raises(MissingVariable, match="TENSORWIRE_SECRET"):
            _interpolate(value, {})
        with pytest.raises(MissingVariable):
            _interpolate(value, {"TENSORWIRE_SECRET": ""})
        assert _interpolate(value, {"TENSORWIRE_SECRET": "s3cret"}) == "s3cret"


def test_compose_file_declares_real_daemons() -> None:
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    services = _daemons(spec)
    assert set(services) == {"ps", "worker0", "worker1"}
    assert set(spec["services"]) - set(services) == {"prometheus", "grafana"}
    for name, svc in services.items():
        assert svc["command"][0] in ("tensorwire-ps", "tensorwire-worker")
        assert "tcp" in svc["command"][svc["command"].index("--transport") + 1]
        assert svc["environment"]["TENSORWIRE_SECRET"], name
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert "USER tensorwire" in dockerfile
    # The checkpoints volume's mount point exists in the image, owned by the daemons' user.
    assert "mkdir -p /data/checkpoints && chown -R tensorwire /data" in dockerfile
    assert all(svc["shm_size"] == "2gb" for svc in services.values())  # regions live in /dev/shm
    for name in ("worker0", "worker1"):
        assert services[name]["depends_on"] == {"ps": {"condition": "service_healthy"}}
    for svc in services.values():
        assert svc["healthcheck"]["test"][:3] == ["CMD", "tensorwire", "ping"]


def _run_lines(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined as Docker joins them."""
    joined = re.sub(r"\\\n", "", dockerfile)
    return [line for line in joined.splitlines() if line and not line.startswith("#")]


def test_image_installs_dependencies_in_a_layer_before_the_source(tmp_path: Path) -> None:
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    lines = _run_lines(dockerfile)
    order = [i for i, line in enumerate(lines) if line.startswith(("COPY", "RUN pip install"))]
    steps = [lines[i] for i in order]
    assert steps[0] == "COPY pyproject.toml ./"
    assert steps[1].startswith("RUN pip install -r /tmp/requirements.txt")
    assert steps.index("COPY tensorwire ./tensorwire") > 1
    assert re.search(r"^FROM python:3\.1[1-9]", dockerfile, re.M), "the step needs tomllib"
    if sys.version_info < (3, 11):  # (the image's Python has tomllib; this one has not)
        pytest.skip("the requirements step runs in the image's Python 3.11; this is older")
    # Run the requirements step as Docker would (/bin/sh -c, the ARG as an environment variable).
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    step = next(line for line in lines if line.startswith("RUN python -c"))
    out = tmp_path / "requirements.txt"
    command = step.removeprefix("RUN ").replace("python", sys.executable, 1)
    command = command.replace("/tmp/requirements.txt", str(out))
    env = {**os.environ, "EXTRAS": "ps,grpc"}
    subprocess.run(["/bin/sh", "-c", command], cwd=tmp_path, env=env, check=True, timeout=60)
    requirements = out.read_text().splitlines()
    names = {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0] for r in requirements}
    assert {"numpy", "pyzmq", "msgpack", "ml_dtypes", "grpcio", "protobuf", "scikit-learn"} <= names
    assert "torch" not in names and "nixl-cu12" not in names


def test_build_context_leaves_out_what_the_image_does_not_need() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "tests", "**/__pycache__"} <= set(ignored)


def test_compose_services_run_locally(tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    services: dict[str, Any] = _daemons(spec)
    hosts = {svc.get("hostname", name) for name, svc in services.items()}
    ports: dict[tuple[str, str], int] = {}

    def local(service: str, arg: str) -> str:
        def endpoint(m: re.Match[str]) -> str:
            host, port = m.group(1), m.group(2)
            owner = service if host in ("0.0.0.0", "127.0.0.1") else host
            return f"tcp://127.0.0.1:{ports.setdefault((owner, port), free_port())}"

        arg = re.sub(r"tcp://([\w.]+):(\d+)", endpoint, arg)
        arg = arg.replace("/data", str(tmp_path))
        return "127.0.0.1" if arg in hosts else arg

    outer = {**os.environ, "TENSORWIRE_SECRET": secrets.token_hex(16)}  # as the README says
    procs = Processes(tmp_path)
    commands: dict[str, tuple[list[str], dict[str, str]]] = {}
    started: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, svc in services.items():
            cmd = [str(BIN / svc["command"][0])] + [local(name, a) for a in svc["command"][1:]]
            # each container has its own port 9100; here they share one host
            cmd[cmd.index("--metrics-port") + 1] = "0"
            if name.startswith("worker"):
                cmd += ["--metrics", str(tmp_path / f"{name}.json")]
            declared = svc["environment"].items()
            env = {k: _interpolate(v, outer) for k, v in declared}
            commands[name] = (cmd, env)
            proc = started[name] = procs.start(cmd, log=name, env=env)
            # As compose's depends_on (service_healthy): each service's health check passes
            # before the next starts.
            probe = [local(name, a) for a in svc["healthcheck"]["test"][1:]]
            probe[0] = str(BIN / probe[0])
            for _ in range(120):  # bounded: at most about a minute
                if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
                    break
                code = proc.poll()
                if code == 0:  # a worker may finish the job before a probe catches it
                    break
                assert code is None, f"{name} exited with {code} before it was healthy"
                time.sleep(0.5)
            else:
                raise AssertionError(f"{name} never passed its health check {probe}")
        workers = [name for name in services if name != "ps"]
        codes = {name: started[name].wait(120) for name in workers}
        # The server lingers (--linger 30) and still passes its health check. A worker that
        # failed near the end is started again by its restart policy (on-failure): it hears
        # that the job is done and exits 0, so compose does not start it yet again.
        assert started["ps"].poll() is None, procs.log("ps")
        ps_probe = [local("ps", a) for a in services["ps"]["healthcheck"]["test"][1:]]
        ps_probe[0] = str(BIN / ps_probe[0])
        assert subprocess.run(ps_probe, capture_output=True, timeout=30).returncode == 0
        cmd, env = commands["worker1"]
        cmd[cmd.index("--metrics") + 1] = str(tmp_path / "worker1-again.json")
        codes["worker1 again"] = procs.start(cmd, log="worker1-again", env=env).wait(60)
        # `docker compose stop` (or Ctrl-C): SIGTERM, and the lingering server exits 0.
        started["ps"].send_signal(signal.SIGTERM)
        codes["ps"] = started["ps"].wait(30)
    finally:
        procs.kill()
    logs = {name: procs.log(name) for name in [*services, "worker1-again"]}
    assert codes == {name: 0 for name in [*services, "worker1 again"]}, logs
    assert "over tcp" in logs["ps"]
    assert "had ended the job at step 300" in logs["worker1-again"], logs["worker1-again"]
    assert services["ps"]["restart"] == "on-failure" and "--resume-if-present" in commands["ps"][0]
    assert all(svc["restart"] == "on-failure" for svc in services.values())
    metrics = json.loads((tmp_path / "worker0.json").read_text())
    assert metrics["steps"] == 300 and metrics["test_accuracy"] >= 0.95
    assert (tmp_path / "checkpoints" / "ps-shard0.npz").exists()


def _exported_metric_names() -> set[str]:
    """Every sample name the daemons can export: the library's, a parameter server's and a
    worker's (a summary as its _sum and _count), from the code that exports them."""
    from tensorwire import metrics
    from tensorwire.client.metrics import WorkerStats, worker_metrics
    from tensorwire.server.metrics import ps_metrics
    from tensorwire.server.ps import ParameterServer, PSConfig

    server = ParameterServer(PSConfig(bind=f"tcp://127.0.0.1:{free_port()}"))
    try:
        families = [*metrics.snapshot(), *ps_metrics(server), *worker_metrics(WorkerStats(0))]
    finally:
        server.close()
    names = set()
    for m in families:
        names |= {m.name + "_sum", m.name + "_count"} if m.kind == "summary" else {m.name}
    return names


def test_monitoring_profile_scrapes_every_daemon_and_the_dashboard_queries_real_metrics() -> None:
    spec = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    daemons = _daemons(spec)
    # Prometheus scrapes each daemon at the port its command serves metrics on.
    scrape = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
    targets = {
        t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    }
    served = {
        f"{svc.get('hostname', name)}:{svc['command'][svc['command'].index('--metrics-port') + 1]}"
        for name, svc in daemons.items()
    }
    assert targets == served
    for name in ("prometheus", "grafana"):
        assert spec["services"][name]["profiles"] == ["monitoring"]
        for volume in spec["services"][name]["volumes"]:
            assert (ROOT / "docker" / volume.split(":")[0]).exists(), volume
    # Grafana's provisioning names the data source the dashboard's panels use.
    source = yaml.safe_load(
        (ROOT / "docker/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )["datasources"][0]
    assert source["url"] == "http://prometheus:9090"
    dashboard = json.loads((ROOT / "docker/grafana/dashboards/tensorwire.json").read_text())
    exported = _exported_metric_names()
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"]
        for target in panel["targets"]:
            names = set(re.findall(r"\btensorwire_\w+", target["expr"]))
            assert names, target
            assert names <= exported, (panel["title"], names - exported)
            queried |= names
    assert len(queried) >= 20  # the dashboard covers the job, not a token panel
