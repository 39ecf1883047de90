"""Where a suite's time went, from a `TENSORWIRE_TEST_CPU=FILE make test` log.

Prints the span and the CPU seconds of every test together; for each minute, how many of the
pytest-xdist processes were running a test and how many cores the tests used; when each process
ran its last test; and the tests that ended last. Usage: python timeline.py FILE
"""

from __future__ import annotations

import collections
import sys


def main(path: str) -> None:
    rows = []
    with open(path) as log:
        for line in log:
            cpu, wall, start, worker, nodeid = line.rstrip("\n").split(" ", 4)
            rows.append((float(cpu), float(wall), float(start), worker, nodeid))
    t0 = min(r[2] for r in rows)
    t1 = max(r[2] + r[1] for r in rows)
    print(f"span {t1 - t0:.0f} s, tests' CPU {sum(r[0] for r in rows):.0f} s")
    used: dict[int, float] = collections.defaultdict(float)
    busy: dict[int, float] = collections.defaultdict(float)
    for cpu, wall, start, _worker, _nodeid in rows:
        if wall <= 0:
            continue
        rate, t, end = cpu / wall, start - t0, start - t0 + wall
        while t < end:  # spread the test over the minutes it ran in, at its average rate
            minute = int(t // 60)
            upto = min(end, (minute + 1) * 60)
            used[minute] += rate * (upto - t)
            busy[minute] += upto - t
            t = upto
    for minute in sorted(used):
        print(
            f"{minute * 60:5d} s  processes in a test {busy[minute] / 60:4.2f}  "
            f"cores used by tests {used[minute] / 60:4.2f}"
        )
    last: dict[str, float] = collections.defaultdict(float)
    for _cpu, wall, start, worker, _nodeid in rows:
        last[worker] = max(last[worker], start + wall - t0)
    print("each process's last test ended at", {k: round(v) for k, v in sorted(last.items())})
    for cpu, wall, start, worker, nodeid in sorted(rows, key=lambda r: -(r[2] + r[1]))[:10]:
        print(f"{start - t0:6.0f} s +{wall:5.1f} s, CPU {cpu:5.1f} s, {worker} {nodeid}")


if __name__ == "__main__":
    main(sys.argv[1])
