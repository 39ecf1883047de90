"""A server that takes back a worker SIGKILLed and started again N times: its descriptors,
resident memory and threads, and this host's tensorwire segments, before, after a quarter of the
restarts and at the end. ``python restarts.py TRANSPORT ROUNDS SECONDS_APART`` (README.md)."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

transport, rounds, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
venv = Path(__file__).resolve().parents[2] / ".venv" / "bin"
env = dict(os.environ, PATH=f"{venv}:{os.environ['PATH']}")
address = f"tcp://127.0.0.1:{random.randint(20000, 30000)}"
logs = Path(f"/tmp/restarts-{transport}")
logs.mkdir(parents=True, exist_ok=True)


def start(args: list[str], log: str) -> subprocess.Popen[bytes]:
    with open(logs / log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)


def worker(rank: int) -> subprocess.Popen[bytes]:
    args = ["--servers", address, "--rank", str(rank), "--workers", "2", "--no-progress"]
    return start(["tensorwire-worker", *args, "--transport", transport], f"w{rank}.log")


def sample(pid: int) -> tuple[int, float, int, int]:
    """(descriptors, resident MiB, threads) of ``pid``, and this host's tensorwire segments."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    rss = next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))
    segments = sum(1 for name in os.listdir("/dev/shm") if name.startswith("tensorwire"))
    fds, threads = len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))
    return fds, round(rss, 1), threads, segments


server_args = ["--bind", address, "--workers", "2", "--steps", "100000000", "--no-progress"]
checkpoints = ["--checkpoint-dir", str(logs / "ck"), "--checkpoint-every", "1000"]
ps = start(["tensorwire-ps", *server_args, "--transport", transport, *checkpoints], "ps.log")
w0, w1 = worker(0), worker(1)
time.sleep(8)
print("start", sample(ps.pid), flush=True)
for k in range(rounds):
    w1.send_signal(signal.SIGKILL)
    w1.wait()
    w1 = worker(1)
    time.sleep(every)
    if k == rounds // 4:
        print("quarter", sample(ps.pid), flush=True)
print("end", sample(ps.pid), flush=True)
text = (logs / "ps.log").read_text()
print("rejoined:", text.count("rejoined from"))
for p in (w0, w1, ps):
    p.send_signal(signal.SIGTERM)
print("exits", [p.wait(60) for p in (w0, w1, ps)])
