"""The project's documents: the README's library example runs as printed, and links resolve."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
