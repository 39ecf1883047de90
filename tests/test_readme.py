"""The README's library example runs as printed."""

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
