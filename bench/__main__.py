"""``python -m tensorwire.bench``: the same as ``tensorwire bench``."""

from .cli import main

raise SystemExit(main(prog="python -m tensorwire.bench"))
