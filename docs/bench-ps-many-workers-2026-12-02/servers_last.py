"""A job whose servers start after its workers (a server restarted, or started last by an
orchestrator), so that every worker's join is waiting as the servers come up: how long the job
takes to form, from the servers' start (each server's ``formed_s``, in its --metrics summary).
16 workers and 2 servers on this machine, each transport in turn.

    python docs/bench-ps-many-workers-2026-12-02/servers_last.py [WORKERS] [TRANSPORTS]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorwire.client.launch import free_port, job_environment, ps_command, worker_command

SERVERS = 2
#: the workers start first, and are all waiting for the servers by then
WORKERS_HEAD_START = 15.0


def formed_after(transport: str, workers: int) -> list[float]:
    """Each server's seconds from its start to the job formed."""
    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(SERVERS)]
    common = ["--transport", transport, "--log-level", "WARNING", "--no-progress"]
    env = job_environment()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(workers):
            cmd = worker_command(
                addresses, "--model", "digits", "--metrics", f"{tmp}/w{r}.json", *common,
                rank=r, workers=workers,
            )  # fmt: skip
            with open(f"{tmp}/w{r}.log", "w") as log:
                procs.append(subprocess.Popen(cmd, env=env, stderr=log))
        time.sleep(WORKERS_HEAD_START)
        for s, address in enumerate(addresses):
            cmd = ps_command(
                address, "--steps", "5", "--metrics", f"{tmp}/ps{s}.json", *common,
                shard=s, shards=SERVERS, workers=workers,
            )  # fmt: skip
            with open(f"{tmp}/ps{s}.log", "w") as log:
                procs.append(subprocess.Popen(cmd, env=env, stderr=log))
        codes = [p.wait(600) for p in procs]
        if any(codes):
            raise SystemExit(f"{transport}: exit codes {codes}")
        summaries = [json.loads(Path(f"{tmp}/ps{s}.json").read_text()) for s in range(SERVERS)]
        return [summary["formed_s"] for summary in summaries]


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    transports = sys.argv[2].split(",") if len(sys.argv) > 2 else ["tcp", "nixl"]
    for transport in transports:
        formed = formed_after(transport, workers)
        said = ", ".join(f"{f:.2f}" for f in formed)
        print(f"{transport}: {workers} workers, formed after {said} s of the servers' start")


if __name__ == "__main__":
    main()
