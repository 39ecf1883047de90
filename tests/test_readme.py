"""The project's documents: the README's library example runs as printed, links resolve, and
every flag they and the code name exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensorwire.cli import COMMANDS


def test_readme_library_example_runs(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    code = text[start : text.index("```", start)]
    script = tmp_path / "example.py"
    script.write_text(code + "\nassert w1.shape == (1024, 1024) and ids.shape == (7, 128)\n")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr


def test_documents_link_only_to_files_that_exist() -> None:
    """Every relative link in the project's documents points into this repository (a clone has
    nothing beside it), at a file that exists."""
    import re

    root = Path(__file__).resolve().parent.parent
    docs = [root / n for n in ("README.md", "BENCHMARKS.md", "RELIABILITY.md")]
    docs += sorted((root / "docs").glob("*.md"))
    checked = 0
    for doc in docs:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(root), f"{doc.name} links outside the repository: {target}"
            assert path.exists(), f"{doc.name} links to a missing file: {target}"
            checked += 1
    assert checked >= 10


#: flags the documents give to tools that are not ours (pip, docker, kubectl, ray, perf)
OUTSIDE_FLAGS = {
    "--no-deps",
    "--build",
    "--build-arg",
    "--cap-add",
    "--ulimit",
    "--ipc",
    "--from-literal",
    "--for",  # kubectl wait --for=condition=complete
    "--head",
    "--per-thread",
    # unshare(1), which `bench chaos --hosts separate` runs each daemon under
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    # setpriv(1), which starts that unshare to die with the run
    "--pdeathsig",
    # pytest's and pytest-xdist's, which `make test` passes (docs/testing.md)
    "--dist",
    "--durations",
}


#: flags of ours that no --help shows: how one of our processes runs another
INTERNAL_FLAGS = {"--ucx-json"}


def _our_flags(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every option of every command and benchmark tool, read from their own --help."""
    import contextlib
    import importlib
    import io
    import re

    commands: list[tuple[str, list[str]]] = [("tensorwire.cli", [c, "--help"]) for c in COMMANDS]
    commands += [("tensorwire.cli", ["bench", c, "--help"]) for c in ("run", "serve", "ps")]
    commands += [("tensorwire.cli", ["bench", c, "--help"]) for c in ("soak", "chaos")]
    commands += [
        (f"tensorwire.{m}", ["--help"])
        for m in ("demo", "bench.cycle", "bench.notifier_kills", "bench.copy_threads")
    ]
    commands += [
        (f"tensorwire.{m}", ["--help"])
        for m in ("bench.metrics_cost", "bench.depths", "bench.polling", "bench.ray_launch")
    ]
    commands += [
        (f"tensorwire.bench.{m}", ["--help"]) for m in ("nixl_fence", "registration", "startup")
    ]
    flags: set[str] = set()
    for module, argv in commands:
        main = importlib.import_module(module).main
        out = io.StringIO()
        monkeypatch.setattr(sys, "argv", [module, *argv])  # (a main that reads sys.argv)
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            main(argv) if main.__code__.co_argcount else main()
        assert done.value.code == 0, (module, argv)
        found = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.getvalue()))
        assert found, (module, argv)
        flags |= found
    return flags


def test_every_flag_the_documents_name_is_a_flag_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag renamed or removed stays in the pages users copy commands from, and in the
    errors that tell them what to pass; each `--flag` written in code in the documents, and
    each in the code, is an option of one of the project's commands (or of an outside tool,
    listed)."""
    import re

    root = Path(__file__).resolve().parent.parent
    ours = _our_flags(monkeypatch)
    assert {"--step-timeout", "--async-lr", "--wire-dtype", "--curve"} <= ours
    docs = [root / n for n in ("README.md", "BENCHMARKS.md", "RELIABILITY.md")]
    docs += sorted((root / "docs").glob("*.md"))
    unknown: dict[str, set[str]] = {}
    named = 0
    for doc in docs:
        for code in re.findall(r"`([^`]*)`", doc.read_text()):
            for flag in re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", code):
                named += 1
                if flag not in ours and flag not in OUTSIDE_FLAGS:
                    unknown.setdefault(flag, set()).add(doc.name)
    # and the messages, help and comments of the code: what an error tells a user to pass
    code = [
        path
        for package in ("tensorwire", "client", "server", "bench")
        for path in (root / package).rglob("*.py")
    ]
    # and the commands the deployments run
    code += [*(root / "docker").glob("*.yaml"), *(root / "deploy").rglob("*.yaml")]
    for path in code:
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", path.read_text()):
            named += 1
            if flag not in ours and flag not in OUTSIDE_FLAGS | INTERNAL_FLAGS:
                unknown.setdefault(flag, set()).add(str(path.relative_to(root)))
    assert named > 500
    assert not unknown, f"flags in the documents that no command of ours has: {unknown}"
