import concurrent.futures as cf
import os
import re
import subprocess
import sys

PY = sys.executable
VALUES = [
    "-1",
    "0",
    "99999",
    "nan",
    "inf",
    "",
    "x",
    "1e400",
    " ",
    "tcp://127.0.0.1:99999",
    "/nonexistent/d/f",
    "1.5",
    "-0",
    "1_0",
    "0x10",
    "tcp://[::1]:0",
    "\x00",
    "é",
]


def flags(mod):
    h = subprocess.run([PY, "-m", mod, "--help"], capture_output=True, text=True).stdout
    out = []
    for m in re.finditer(r"^\s+(--[a-z0-9-]+)(?:,| ([A-Z_]+)|\s|$)", h, re.M):
        out.append(m.group(1))
    return sorted(set(out) - {"--help", "--version"})


base = {
    "tensorwire.server.daemon": ["--join-timeout", "0.3", "--no-progress"],
    "tensorwire.client.worker": ["--connect-timeout", "0.3", "--no-progress"],
}
jobs = []
for mod, b in base.items():
    for f in flags(mod):
        for v in VALUES:
            jobs.append((mod, b, f, v))


def one(j):
    mod, b, f, v = j
    env = dict(os.environ)
    env.pop("TENSORWIRE_SECRET", None)
    try:
        r = subprocess.run(
            [PY, "-m", mod, *b, f, v],
            capture_output=True,
            text=True,
            timeout=15,
            env=env,
            cwd=os.environ.get("TMPDIR", "/tmp"),
        )
    except subprocess.TimeoutExpired:
        return (j, "TIMEOUT", "")
    except ValueError as e:
        return (j, "ARGV", str(e))
    out = r.stdout + r.stderr
    if "Traceback" in out:
        return (j, "TRACEBACK", out[-1500:])
    return (j, r.returncode, out.strip().splitlines()[-1] if out.strip() else "")


print(len(jobs), file=sys.stderr)
with cf.ThreadPoolExecutor(3) as ex:
    for j, res, tail in ex.map(one, jobs):
        print(
            repr((j[0].split(".")[-1], j[2], j[3])), res, tail[:300].replace("\n", "|"), flush=True
        )
