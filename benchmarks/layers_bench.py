"""`make bench` (part): a cold build's package layers, one BuildKit build after another against all at once
(nodekit/image/builder/driver.py, ``_make_layers``), on each image store's engine, in one run.

Both sides run nodekit's own code on the demo project's staged contexts (a scratch copy of examples/ddp): "one by
one" builds each layer alone (three calls, as nodekit did before), "at once" is what ``nodekit build`` does now.
Every build is ``--no-cache`` (each layer installed again; the wheelhouse is already filled), the order alternates
per pair, the blob store is a fresh one each time. Prints one line per build and the medians; the figures in
docs/benchmarks.md ("Package layers built at once") come from its output.

Each build must end within ``--deadline`` seconds (600; a cold demo build takes under 60), else the bench stops
and names it.

    nk-heavy .venv/bin/python benchmarks/layers_bench.py [--pairs 2] [--stores classic,containerd] [--deadline 600]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._project import copy_demo, exit_on_signals  # noqa: E402
from benchmarks._shipcluster import engine_of  # noqa: E402
from nodekit.config.settings import load  # noqa: E402
from nodekit.image.blobs import BlobStore  # noqa: E402
from nodekit.image.builder import driver  # noqa: E402
from nodekit.image.builder.planning import require_base  # noqa: E402
from nodekit.image.builder.staging import stage_contexts  # noqa: E402
from nodekit.image.lock import ensure_lock  # noqa: E402
from nodekit.image.plan import PACKAGE_LAYERS  # noqa: E402
from nodekit.image.probe import target as probe_target  # noqa: E402
from nodekit.system.progress import NullReporter  # noqa: E402


def deadline(seconds: int, what: str) -> None:
    """From now, ``what`` ends by ``seconds`` (0: no deadline): past it, SystemExit naming it, in the main thread, so
    that the builds in flight are ended as on Ctrl-C (their streams close, their children are ended)."""

    def over(_signum: int, _frame: object) -> None:
        raise SystemExit(f"layers bench: {what} did not end within {seconds} s")

    signal.signal(signal.SIGALRM, over)
    signal.alarm(seconds)


def one_store(store: str, pairs: int, limit: int) -> dict[str, list[float]]:
    os.environ["DOCKER_HOST"] = engine_of(store)  # checks the engine keeps images in that store
    project = copy_demo("nk-layers-bench.")
    rep = NullReporter()
    settings = load(project / "nodekit.toml")
    base = require_base(settings)
    tgt = probe_target(settings, require_probe=True)
    lock, _ = ensure_lock(settings, rep, dry_run=False, target=tgt)
    plan = stage_contexts(settings, lock, base.identity, tgt, rep, no_cache=True)
    times: dict[str, list[float]] = {"one by one": [], "at once": []}
    try:
        for i in range(pairs):
            order = ["one by one", "at once"] if i % 2 == 0 else ["at once", "one by one"]
            for how in order:
                blobs = Path(tempfile.mkdtemp(prefix="nk-layers-blobs.", dir=project))
                store_ = BlobStore(blobs)
                deadline(limit, f"the {store} store's build of the layers {how}")
                t0 = time.monotonic()
                if how == "at once":
                    driver._make_layers(plan, PACKAGE_LAYERS, store_, rep, no_cache=True)
                else:
                    for layer in PACKAGE_LAYERS:
                        driver._make_layers(plan, [layer], store_, rep, no_cache=True)
                took = time.monotonic() - t0
                signal.alarm(0)
                times[how].append(round(took, 1))
                print(f"layers bench: {store} store, {how}: {took:.1f} s", flush=True)
                shutil.rmtree(blobs, ignore_errors=True)
    finally:
        shutil.rmtree(project.parent, ignore_errors=True)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--stores", default="classic,containerd")
    parser.add_argument("--deadline", type=int, default=600, help="seconds each build may take (default 600)")
    args = parser.parse_args()
    exit_on_signals()
    print(f"layers bench: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}, "
          f"{os.cpu_count()} cores", flush=True)  # fmt: skip
    for store in args.stores.split(","):
        times = one_store(store, args.pairs, args.deadline)
        med = {how: statistics.median(v) for how, v in times.items()}
        print(f"layers bench: {store} store: one by one {med['one by one']:.1f} s {times['one by one']}, at once "
              f"{med['at once']:.1f} s {times['at once']}: {med['one by one'] - med['at once']:+.1f} s saved",
              flush=True)  # fmt: skip
    print(f"layers bench: done, load {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
