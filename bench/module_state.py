"""Cost of the sandbox worker's per-call module-state work (docs/security.md, "Module state").

    .venv/bin/python -I -S bench/module_state.py [--repeat N]

Loads the modules generated code may use as a worker does, builds the guard (audit hook
installed, as in a worker) and times, per run of generated code: the fingerprint check of the
allowed modules' attribute tables and the guard's builtins (`ModuleState.changed`), and the reset of
`random` and `decimal` (`host.fresh_state`), each as a ratio to a baseline timed in the same run:
the smallest tool call's own work (a savepoint, one indexed SELECT, release) on an in-memory
database. Run with `-I -S` like a worker.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worldsmith.runtime.sandbox import host, worker  # noqa: E402
from worldsmith.runtime.sandbox.guard import Guard  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5000)
    args = parser.parse_args()
    worker._preload(False)
    guard = Guard()
    guard.install()
    tables = guard.state._tables
    entries = sum(len(keys) for _, _, keys, _ in tables)
    check = timeit.timeit(guard.state.changed, number=args.repeat) / args.repeat
    reset = timeit.timeit(lambda: host.fresh_state(2**63 + 12345), number=args.repeat) / args.repeat
    base = _baseline(args.repeat)
    print(
        f"baseline (savepoint + one indexed SELECT + release): {base * 1e6:.1f} us per call\n"
        f"fingerprint check: {check * 1e6:.1f} us per call, x{check / base:.1f} the baseline "
        f"({len(tables)} tables, {entries} entries)\n"
        f"random + decimal reset: {reset * 1e6:.1f} us per call, x{reset / base:.2f} the baseline"
    )


def _baseline(repeat: int) -> float:
    """Seconds of the smallest tool call's database work, the yardstick of the figures above."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"row {i}") for i in range(1000)])

    def call() -> None:
        conn.execute("SAVEPOINT call")
        conn.execute("SELECT name FROM t WHERE id = ?", (500,)).fetchone()
        conn.execute("RELEASE call")

    return timeit.timeit(call, number=repeat) / repeat


if __name__ == "__main__":
    main()
