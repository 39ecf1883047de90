"""add_peers.py with the sender of another checkout (``python add_peers_at.py DIR``: an older
commit's tree, e.g. ``git worktree add /tmp/old f3659a8~1``), for a before and after on one
machine. The receivers are this checkout's (the change is the sender's alone)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

tree = sys.argv.pop(1)
# (the editable install's finder comes before sys.path: set aside, so that DIR's tensorwire loads)
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
import tensorwire  # noqa: E402

print(f"# the sender of {tensorwire.__file__}", flush=True)
runpy.run_path(str(Path(__file__).with_name("add_peers.py")), run_name="__main__")
