"""Presenting benchmark results: a table (rich when installed), JSON, and a log-log plot."""

from __future__ import annotations

import os
from typing import Any

from tensorwire.job import files

from .common import human

SCHEMA = "tensorwire.bench/1"


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


#: the columns a run has only where it measured their reference: (row key, column head), of
#: the throughput table and of the round trips'
_OPTIONAL_TPUT = [("x_torch_queue", "vs torch-queue"), ("x_gloo", "vs gloo")]
_OPTIONAL_LAT = [("lower_than_gloo", "gloo / this")]


def _measured(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Those of ``columns`` some row has a figure for (``--device cuda`` with torch measures
    torch-queue; ``--gloo``, gloo)."""
    return [(key, head) for key, head in columns if any(r.get(key) is not None for r in rows)]


def table_rows(result: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    tput_more = _measured(result["throughput"], _OPTIONAL_TPUT)
    lat_more = _measured(result["latency"], _OPTIONAL_LAT)
    tput = [
        [
            human(r["size"]),
            r["method"],
            f"{r['gbps']:.3f}",
            _ratio(r["x_grpc"]),
            _ratio(r.get("x_grpc_stream")),
            _ratio(r["x_memcpy"]),
            *(_ratio(r.get(key)) for key, _ in tput_more),
            f"{_ratio(r['x_limit'])} {r['limit']}" if r["limit"] else "",
        ]
        for r in result["throughput"]
    ]
    lat = [
        [
            r["method"],
            human(r["bytes"]),
            f"{r['median_us']:.1f}",
            f"{r['p99_us']:.1f}",
            _ratio(r["lower_than_grpc"]),
            _ratio(r.get("lower_than_grpc_stream")),
            *(_ratio(r.get(key)) for key, _ in lat_more),
            f"{_ratio(r['x_limit'])} {r['limit']}" if r.get("limit") else "",
        ]
        for r in result["latency"]
    ]
    return tput, lat


TPUT_HEAD = ["size", "method", "GB/s", "vs grpc", "vs grpc-stream", "vs memcpy", "vs raw limit"]

LAT_HEAD = [
    "round trip",
    "tensor",
    "median us",
    "p99 us",
    "grpc / this",
    "grpc-stream / this",
    "vs raw limit",
]


def heads(result: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The two tables' column heads; "vs torch-queue", "vs gloo" and "gloo / this" where the
    run measured them."""
    tput_more = [head for _, head in _measured(result["throughput"], _OPTIONAL_TPUT)]
    lat_more = [head for _, head in _measured(result["latency"], _OPTIONAL_LAT)]
    return TPUT_HEAD[:-1] + tput_more + TPUT_HEAD[-1:], LAT_HEAD[:-1] + lat_more + LAT_HEAD[-1:]


def render_plain(result: dict[str, Any]) -> str:
    out = []
    for head, rows in zip(heads(result), table_rows(result), strict=True):
        widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
        out.append("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
        out.extend("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
        out.append("")
    return "\n".join(out).rstrip()


def markdown(result: dict[str, Any]) -> str:
    """Both tables as GitHub markdown (what BENCHMARKS.md shows)."""
    out = []
    for head, rows in zip(heads(result), table_rows(result), strict=True):
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---:|" * len(head))
        out.extend("| " + " | ".join(row) + " |" for row in rows)
        out.append("")
    return "\n".join(out)


def print_tables(result: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render_plain(result))
        return
    console = Console()
    tput, lat = table_rows(result)
    tput_head, lat_head = heads(result)
    for title, head, rows in (
        ("throughput (median GB/s)", tput_head, tput),
        ("latency", lat_head, lat),
    ):
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="right")
        previous = None
        for row in rows:
            if previous is not None and row[0] != previous:
                table.add_section()
            previous = row[0]
            table.add_row(*row)
        console.print(table)


def write_json(path: str, result: dict[str, Any]) -> None:
    """Write ``result`` whole (the sweep rewrites it after each size: a reader sees either)."""
    text = (files.json_text(result) + "\n").encode()
    files.write_whole(path, lambda f: f.write(text))


def plot_format_problem(path: str) -> str | None:
    """Why matplotlib cannot draw into ``path`` (its extension names no format it writes), or
    None. Before, such a path failed with a traceback after the whole sweep had run."""
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext in formats:
        return None
    return (
        f"{'no file extension' if not ext else f'.{ext} is not an image format'}: "
        f"name the file .png, .svg or .pdf (or one of {', '.join(sorted(formats))})"
    )


def plot(path: str, result: dict[str, Any]) -> None:
    """Throughput against size, one line per method, log-log axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    methods: dict[str, list[tuple[int, float]]] = {}
    for r in result["throughput"]:
        methods.setdefault(r["method"], []).append((r["size"], r["gbps"]))
    for m, pts in methods.items():
        pts.sort()
        # references dashed, batch rows ("shm x32") dotted beside their transport's line
        style = "--" if m in ("memcpy", "raw-tcp", "zmq", "gloo") else ":" if " x" in m else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({r["size"] for r in result["throughput"]})
    ax.set_xticks(sizes, [human(s) for s in sizes])
    ax.set_xlabel("tensor size")
    ax.set_ylabel("throughput (GB/s, median)")
    cpu = result.get("machine", {}).get("cpu_count")
    ax.set_title(f"tensorwire bench ({cpu} CPUs): transports vs references")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
