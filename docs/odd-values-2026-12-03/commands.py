import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile

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
    "1,,2",
    "0x10",
    "é",
]


def flags(cmd):
    h = subprocess.run([PY, *cmd, "--help"], capture_output=True, text=True).stdout
    opts = h.split("options:", 1)[-1]
    out = []
    for m in re.finditer(r"^\s+(?:-\w, )?(--[a-z0-9-]+)( [A-Z_{.]|=| [a-z|]+\S*)", opts, re.M):
        out.append(m.group(1))
    return sorted(set(out) - {"--help", "--version"})


# commands and a quick, otherwise-valid base
CMDS = {
    ("-m", "tensorwire.bench"): [
        "--sizes",
        "4K",
        "--transports",
        "shm",
        "--repeat",
        "1",
        "--round-trips",
        "2",
        "--messages",
        "4",
        "--no-progress",
    ],
    ("-m", "tensorwire.bench", "ps"): ["--steps", "2", "--transports", "shm", "--no-progress"],
    ("-m", "tensorwire.bench", "soak"): ["--duration", "1"],
    ("-m", "tensorwire.bench", "chaos"): ["--steps", "5"],
    ("-m", "tensorwire.bench", "serve"): ["--once"],
    ("-m", "tensorwire.bench", "run"): ["--connect", "tcp://127.0.0.1:1"],
    ("-m", "tensorwire.cli", "export"): [
        "/nonexistent.npz",
        "--out",
        os.path.join(tempfile.gettempdir(), "x.npz"),
    ],
    ("-m", "tensorwire.cli", "keys"): [os.path.join(tempfile.gettempdir(), "odd-keys")],
    ("-m", "tensorwire.cli", "ray-job"): ["--steps", "1"],
    ("-m", "tensorwire.cli", "demo"): ["--steps", "2"],
    ("-m", "tensorwire.cli", "info"): [],
    ("-m", "tensorwire.cli", "ping"): ["tcp://127.0.0.1:1"],
    ("-m", "tensorwire.cli", "top"): ["127.0.0.1:1", "--count", "1"],
}
jobs = []
for cmd, b in CMDS.items():
    fl = flags(cmd)
    print(cmd, fl, file=sys.stderr)
    heavy = cmd[-1] in ("chaos", "ray-job", "demo", "ps")
    for f in fl:
        for v in ["-1", "nan", "", "x", " ", "1e400", "0"] if heavy else VALUES:
            jobs.append((cmd, b, f, v))


def one(j):
    cmd, b, f, v = j
    env = dict(os.environ)
    env.pop("TENSORWIRE_SECRET", None)
    try:
        r = subprocess.run(
            [PY, *cmd, *b, f, v],
            capture_output=True,
            text=True,
            timeout=40,
            env=env,
            cwd=os.environ.get("TMPDIR", "/tmp"),
        )
    except subprocess.TimeoutExpired:
        return (j, "TIMEOUT", "")
    out = r.stdout + r.stderr
    if "Traceback" in out:
        return (j, "TRACEBACK", out[-1500:])
    return (j, r.returncode, out.strip().splitlines()[-1] if out.strip() else "")


print(len(jobs), file=sys.stderr)
with cf.ThreadPoolExecutor(2) as ex:
    for j, res, tail in ex.map(one, jobs):
        print(
            repr((" ".join(j[0][1:]), j[2], j[3])), res, tail[:400].replace("\n", "|"), flush=True
        )
