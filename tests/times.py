"""Where a test run's time went, from the lines ``NODEKIT_TEST_TIMES=FILE`` made (tests/conftest.py): per worker
its busy time, per test file its set-up and call time, and the slowest set-ups (a cold machine's builds show there).

    .venv/bin/python -m tests.times FILE [--top 15]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    by_worker: dict[str, float] = defaultdict(float)
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    setups: list[tuple[float, str]] = []
    failed = [r["test"] for r in rows if r["outcome"] == "failed"]
    for r in rows:
        by_worker[str(r.get("worker"))] += r["seconds"]
        phase = {"setup": 0, "call": 1}.get(r["when"], 2)
        by_file[r["test"].split("::", 1)[0]][phase] += r["seconds"]
        if r["when"] == "setup":
            setups.append((r["seconds"], r["test"]))
    span = max(r["at"] for r in rows) - min(r["at"] - r["seconds"] for r in rows) if rows else 0.0
    print(f"{len({r['test'] for r in rows})} tests, {span / 60:.1f} min from the first start to the last end")
    for worker, busy in sorted(by_worker.items()):
        print(f"  worker {worker}: {busy / 60:.1f} min busy")
    print(f"\nfiles by time (set-up + call + tear-down), top {args.top}:")
    for name, (s, c, t) in sorted(by_file.items(), key=lambda kv: -sum(kv[1]))[: args.top]:
        print(f"  {s + c + t:7.1f} s  (set-up {s:6.1f}, call {c:6.1f}, tear-down {t:5.1f})  {name}")
    print(f"\nslowest set-ups, top {args.top}:")
    for seconds, test in sorted(setups, reverse=True)[: args.top]:
        print(f"  {seconds:7.1f} s  {test}")
    if failed:
        print("\nfailed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
