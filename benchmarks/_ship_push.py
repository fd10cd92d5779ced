"""One timed `nodekit push` through the Python API, run by benchmarks/ship_bench.py on the head (inside host 0's
network namespace, so that ssh:// targets are reached over the virtual network), as `nodekit push` plans it: the
codec per link chosen from what this machine and each target can do (``--compress``, auto by default). Prints one
JSON line: {"seconds": ..., "sent": {target: bytes}, "skipped": {target: layers}, "relayed": {...}, "codecs": [...]}.

    python benchmarks/_ship_push.py --source unix:///... [--whole | --store DIR] [--relay MODE] [--compress C] \
        REF ssh://root@ADDR ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--whole", action="store_true", help="send every layer (nodekit's push before issue 10)")
    parser.add_argument("--store", type=Path, help="the project's blob store (nodekit push passes it from the project)")
    parser.add_argument("--relay", default="auto", help="auto, always or never (--whole implies never)")
    parser.add_argument("--compress", default="auto", choices=["auto", "zstd", "gzip", "none"])
    parser.add_argument("--fanout", type=int, help="nodes each relay node feeds (1: a chain; default the tree's)")
    parser.add_argument("ref")
    parser.add_argument("targets", nargs="+")
    opts = parser.parse_args()
    from nodekit import ship
    from nodekit.ship import tree
    from nodekit.system.progress import NullReporter

    if opts.fanout is not None:
        tree.FANOUT = opts.fanout

    t0 = time.monotonic()
    src = ship.source_of(opts.ref, opts.source, store=opts.store)
    with ship.SharedSsh():  # as nodekit push does
        states = ship.survey(src, [ship.Target(t.rsplit("@", 1)[-1], t) for t in opts.targets])
        if opts.whole:
            states = [dataclasses.replace(st, chains=None) for st in states]
        relay = cast("ship.RelayMode", "never" if opts.whole else opts.relay)
        compress = cast("ship.Compress", opts.compress)
        plan = ship.plan_push(src, states, compress=compress, here_zstd=ship.zstd_here())
        result = ship.push(plan, NullReporter(), relay=relay)
    seconds = time.monotonic() - t0
    codecs = sorted({s.codec for s in plan.loads()})
    print(json.dumps({"seconds": seconds, "sent": result.sent, "skipped": result.layers_skipped,
                      "relayed": result.relayed, "codecs": codecs}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
