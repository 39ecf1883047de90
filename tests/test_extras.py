"""A lean install: the core (shm, tcp) works without the extras, and every feature that needs an
extra says which one in a single line. Each case runs in a child interpreter in which the extra's
package cannot be imported, as on a machine where it is not installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import tensorwire as tw
from tensorwire import extras

from .peers import hiding, run_conformance_hiding, run_hiding

if sys.version_info >= (3, 11):
    import tomllib
else:  # a core dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
GRPC_PACKAGES = ("grpc", "google")  # grpcio and protobuf


def test_without_grpc_the_core_works_and_the_baseline_names_its_extra() -> None:
    lines = run_hiding(
        GRPC_PACKAGES,
        """
        import numpy as np
        with tw.Receiver() as rx:  # serves shm and tcp; grpc only where it is installed
            rx.register("t", (4,), "float32")
            for transport in ("shm", "tcp"):
                with tw.Sender.connect(rx.address, transport=transport, timeout=10) as tx:
                    tx.write("t", np.full(4, 2.0, np.float32))
                    print(transport, rx.wait("t", timeout=10).tolist())
                    rx.release("t")
            try:
                tw.Sender.connect(rx.address, transport="grpc", timeout=10)
            except tw.MissingDependencyError as exc:
                print("sender:", exc)
        try:
            tw.Receiver(grpc=True)
        except tw.MissingDependencyError as exc:
            print("receiver:", exc)
        print("grpc imported:", "grpc" in sys.modules)
        """,
    )
    assert lines[:2] == ["shm [2.0, 2.0, 2.0, 2.0]", "tcp [2.0, 2.0, 2.0, 2.0]"]
    assert lines[2].startswith("sender: transport 'grpc' needs the 'grpc' extra")
    assert lines[2].endswith("pip install 'tensorwire[grpc]'")
    assert lines[3].startswith("receiver: serving the gRPC baseline needs the 'grpc' extra")
    assert lines[4] == "grpc imported: False"
    assert len(lines) == 5, lines


def test_the_conformance_suite_runs_without_grpc() -> None:
    out = run_conformance_hiding(
        GRPC_PACKAGES, "every_dtype_byte_exact and (grpc or tcp) and not stream"
    )
    assert "1 passed, 1 skipped" in out, out
    assert "grpcio is not installed" in out


def test_the_demo_without_its_data_set_says_which_extra_in_one_line() -> None:
    code = hiding("sklearn") + textwrap.dedent(
        """
        from tensorwire.client.demo import main
        sys.exit(main(["--steps", "1"]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "error: the demo trains on scikit-learn's digits data set: pip install 'tensorwire[ps]'"
    ]


def test_python_dash_m_tensorwire_is_the_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tensorwire", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"tensorwire {tw.__version__}"


def test_the_project_carries_its_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def _declared_extras() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


def test_every_extra_a_message_or_page_names_is_declared() -> None:
    # `pip install 'tensorwire[torch]'` with no such extra installs nothing and only warns: a
    # user following an error message would be left where they were (the worker named one).
    named: dict[str, set[str]] = {}
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for package in ("tensorwire", "client", "server", "bench", "examples"):
        files += (ROOT / package).rglob("*.py")
    for path in files:
        for match in re.finditer(r"tensorwire\[([a-z0-9_,\- ]+)\]", path.read_text()):
            for extra in match.group(1).split(","):
                named.setdefault(extra.strip(), set()).add(str(path.relative_to(ROOT)))
    assert {"grpc", "ps", "torch", "gpu"} <= set(named), named  # the scan finds them
    for value in vars(extras).values():  # the Extra records behind require()'s messages
        if isinstance(value, extras.Extra):
            named.setdefault(value.name, set()).add("tensorwire/extras.py")
    unknown = {extra: sorted(where) for extra, where in named.items()}
    for extra in _declared_extras():
        unknown.pop(extra, None)
    assert not unknown, f"extras named but not declared in pyproject.toml: {unknown}"


def test_framework_torch_without_torch_names_its_extra_in_one_line() -> None:
    code = hiding("torch") + textwrap.dedent(
        """
        from tensorwire.client.worker import main
        sys.exit(main(["--servers", "tcp://127.0.0.1:9", "--framework", "torch"]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "--framework torch needs PyTorch" in last, out.stderr
    assert last.endswith("pip install 'tensorwire[torch]'"), out.stderr
    assert "torch" in _declared_extras()
