"""deploy/k8s: the manifests validate offline against the Kubernetes schemas, and the commands
they contain run locally, pod by pod, as a cluster would start them (no cluster runs here: host
names, the downward API and the secret are mapped onto loopback and a temporary directory)."""

from __future__ import annotations

import copy
import json
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from .conftest import free_port
from .jobs import Processes, log_has

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy/k8s"
BIN = Path(sys.executable).parent
#: the oldest Kubernetes the manifests promise to work with: the pod-index label of StatefulSet
#: pods and backoffLimitPerIndex of Indexed Jobs are there from 1.28 on (beta, on by default)
KUBERNETES = "1.29"


def _ready(probe: list[str]) -> bool:
    """Whether a readiness probe passes within a minute (tried every 0.25 s, bounded)."""
    for _ in range(240):
        if subprocess.run(probe, capture_output=True, text=True, timeout=30).returncode == 0:
            return True
        time.sleep(0.25)
    return False


def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    docs = _documents()
    assert {d["kind"] for d in docs} == {"Service", "StatefulSet", "Job"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    # the validator does reject what Kubernetes would: a misspelt field
    broken = copy.deepcopy(next(d for d in docs if d["kind"] == "StatefulSet"))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_an_evicted_worker_is_started_again_without_counting_as_a_failure() -> None:
    """A worker evicted (SIGTERM) exits EXIT_RESTART (--on-sigterm restart): its Job starts it
    again, and its podFailurePolicy keeps that, and any pod disruption, from counting towards
    backoffLimitPerIndex (three evictions failed the index before). A podFailurePolicy needs
    restartPolicy Never (the schemas do not say so: the API server refuses it)."""
    from tensorwire.client.worker import EXIT_RESTART

    (workers,) = [d for d in _documents() if d["kind"] == "Job"]
    spec = workers["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"][container["command"].index("--on-sigterm") + 1] == "restart"
    rules = spec["podFailurePolicy"]["rules"]
    on_exit = [r["onExitCodes"] for r in rules if r["action"] == "Ignore" and "onExitCodes" in r]
    assert on_exit == [
        {"containerName": container["name"], "operator": "In", "values": [EXIT_RESTART]}
    ]
    disrupted = [r for r in rules if r["action"] == "Ignore" and "onPodConditions" in r]
    assert disrupted and disrupted[0]["onPodConditions"] == [
        {"type": "DisruptionTarget", "status": "True"}
    ]


def _pods(docs: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any]]]:
    """(workload, index, pod spec) of every pod the workloads make: a StatefulSet's ordinals and
    an Indexed Job's completion indexes."""
    pods = []
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            count = doc["spec"]["replicas"]
        elif doc["kind"] == "Job":
            assert doc["spec"]["completionMode"] == "Indexed"
            count = doc["spec"]["completions"]
        else:
            continue
        name = doc["metadata"]["name"]
        pods += [(name, i, doc["spec"]["template"]["spec"]) for i in range(count)]
    return pods


def test_every_pod_has_the_secret_shared_memory_and_probes_where_it_serves() -> None:
    for workload, _, spec in _pods(_documents()):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            env = {e["name"]: e for e in container["env"]}
            secret = env["TENSORWIRE_SECRET"]["valueFrom"]["secretKeyRef"]
            assert secret == {"name": "tensorwire", "key": "secret"}  # never a value in a file
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
            assert container["resources"]["requests"]["cpu"]
            command = container["command"]
            assert command[command.index("--metrics-port") + 1] == "9100"
            if workload == "tensorwire-ps":
                named = {p["name"]: p["containerPort"] for p in container["ports"]}
                bind = command[command.index("--bind") + 1]
                assert (
                    f"tcp://0.0.0.0:{named[container['livenessProbe']['tcpSocket']['port']]}"
                    == bind
                )
                # ready once the control plane greets as tensorwire's does, at the bound port
                ping = container["readinessProbe"]["exec"]["command"]
                assert ping[:2] == ["tensorwire", "ping"]
                assert ping[-1] == bind.replace("0.0.0.0", "127.0.0.1")
                assert container["readinessProbe"]["timeoutSeconds"] > float(
                    ping[ping.index("--timeout") + 1]
                )


def test_the_pods_commands_train_locally(tmp_path: Path) -> None:
    """Every pod's command, with its environment as Kubernetes would set it, started at once
    (as a cluster starts them: the workers retry until the server is up); the job trains.
    The server then stays (a StatefulSet restarts one that exits, even with 0), ready, and
    a worker pod started again (its Job's retry) hears that the job is done and exits 0 at
    once; the server's SIGTERM (its pod deleted) ends it, exit 0."""
    docs = _documents()
    pods = _pods(docs)
    service = next(d for d in docs if d["kind"] == "Service")["metadata"]["name"]
    secret = secrets.token_hex(16)
    ports: dict[tuple[str, str], int] = {}

    def local(pod: str, arg: str) -> str:
        def endpoint(m: re.Match[str]) -> str:
            host, port = m.group(1), m.group(2)
            # the pod's own: what it binds, and what its probes reach on its loopback
            own = host in ("0.0.0.0", "127.0.0.1")
            owner = pod if own else host.removesuffix(f".{service}")
            return f"tcp://127.0.0.1:{ports.setdefault((owner, port), free_port())}"

        return re.sub(r"tcp://([\w.-]+):(\d+)", endpoint, arg).replace("/data", str(tmp_path))

    def env_of(container: dict[str, Any], index: int) -> dict[str, str]:
        fields = {
            "metadata.labels['apps.kubernetes.io/pod-index']": str(index),
            "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
            "status.podIP": "127.0.0.1",
        }
        out = {}
        for e in container["env"]:
            source = e["valueFrom"]
            if "fieldRef" in source:
                out[e["name"]] = fields[source["fieldRef"]["fieldPath"]]
            else:
                out[e["name"]] = secret
        return out

    procs = Processes(tmp_path)
    names = [f"{workload}-{index}" for workload, index, _ in pods]
    started: dict[str, tuple[list[str], dict[str, str], list[str] | None]] = {}
    try:
        for workload, index, spec in pods:
            pod = f"{workload}-{index}"
            (container,) = spec["containers"]
            command = container["command"]
            cmd = [str(BIN / command[0])] + [local(pod, a) for a in command[1:]]
            cmd[cmd.index("--metrics-port") + 1] = "0"  # one host here, a port each
            if workload != "tensorwire-ps":
                cmd += ["--metrics", str(tmp_path / f"{pod}.json")]
            procs.start(cmd, log=pod, env=env_of(container, index))
            probe = None
            if "exec" in container.get("readinessProbe", {}):
                probe = container["readinessProbe"]["exec"]["command"]
                probe = [str(BIN / probe[0])] + [local(pod, a) for a in probe[1:]]
                assert _ready(probe)
            started[pod] = (cmd, env_of(container, index), probe)
        server, *workers = procs.procs
        codes = {pod: p.wait(180) for pod, p in zip(names[1:], workers, strict=True)}
        # the job is done: the server lingers, ready, and tells a worker started again so
        ps_cmd, _, ps_probe = started[names[0]]
        assert "--linger" in ps_cmd and ps_probe is not None
        log_has(tmp_path / f"{names[0]}.log", "the job is done: answering at", timeout=60)
        assert server.poll() is None and _ready(ps_probe)
        cmd, env, _ = started[names[1]]
        # (its own summary: the pod's first run's, whole, is read below)
        cmd = [*cmd[: cmd.index("--metrics")], "--metrics", str(tmp_path / "again.json")]
        again = procs.start(cmd, log="restarted-worker", env=env)
        assert again.wait(60) == 0
        server.send_signal(signal.SIGTERM)
        codes[names[0]] = server.wait(30)
    finally:
        procs.kill()
    logs = {pod: procs.log(pod) for pod in names}
    assert codes == {pod: 0 for pod in names}, logs
    told = procs.log("restarted-worker").strip().splitlines()[-1]
    assert told.endswith(
        "had ended the job at step 300 when this worker reached it: nothing is left to train"
    ), told
    nothing = json.loads((tmp_path / "again.json").read_text())
    assert nothing["steps"] == 0 and nothing["job_done_at"] == 300, nothing
    workers = [json.loads((tmp_path / f"{pod}.json").read_text()) for pod in names[1:]]
    assert [w["rank"] for w in workers] == [0, 1]
    assert all(w["steps"] == 300 for w in workers) and workers[0]["test_accuracy"] >= 0.95
    assert (tmp_path / "checkpoints" / "ps-shard0.npz").exists()
    # README's command for the model's parameters, as the server pod would run it
    readme = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"kubectl exec tensorwire-ps-0 -- (tensorwire export [^`]+)`", readme)
    assert found is not None
    export = [local("tensorwire-ps-0", a) for a in found.group(1).split()]
    done = subprocess.run(
        [str(BIN / export[0]), *export[1:]], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "of step 300, from 1 shard, to " in done.stdout, done
    with np.load(tmp_path / "checkpoints" / "model.npz") as model:
        assert set(model.files) == {"layer0.weight", "layer0.bias", "layer1.weight", "layer1.bias"}
    records = [json.loads(line) for line in logs["tensorwire-ps-0"].splitlines() if line[:1] == "{"]
    assert any("joined" in r["message"] and "over tcp" in r["message"] for r in records)
