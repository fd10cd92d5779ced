"""The head's link when one image goes to 16 virtual hosts: relay chains of eight (the head feeds one chain per
eight hosts, as nodekit did before its relay tree) against the relay tree (nodekit/ship/tree.py), in the same run,
on the same hosts (issue 48: the tree at most 1.2 copies).

Each side starts from hosts that hold no image, so the whole image travels. The chains are two pushes at once, each
relaying to its eight hosts with a fan-out of one (``benchmarks/_ship_push.py --fanout 1``): the head then sends a
copy per chain, as a push to sixteen did with at most eight nodes a chain. The tree is one push to all sixteen. The
bytes are the head's veth counters (``ip -s link`` in h0), so SSH's framing and every survey and check are in them.

    python benchmarks/tree_bench.py [--hosts 16] [--mib 64] [--ref REF]

``--ref``: an image of this machine's classic engine (the whole of it travels); by default a fresh image of ``--mib``
MiB of random bytes (gzip cannot shrink it) made in the head's own engine. Prints one line per side and a JSON
record; writes nothing under docs/ (docs/benchmarks.md takes its figures by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._shipcluster import CLASSIC_ENGINE, ShipCluster

ROOT = Path(__file__).resolve().parents[1]
CHAIN_MAX = 8
"""The chains' length the comparison stands for: nodekit's relay chains held at most eight nodes each."""


def pushes(c: ShipCluster, ref: str, source: str, groups: list[list[str]], fanout: int | None) -> tuple[float, int]:
    """One ``_ship_push.py`` per group of target URLs, all at once from the head: seconds until the last ends, and
    the head's link bytes. SystemExit with the output of one that failed."""
    argv = [sys.executable, str(ROOT / "benchmarks" / "_ship_push.py"), "--source", source, "--relay", "always"]
    argv += ["--fanout", str(fanout)] if fanout is not None else []
    before = c.head_tx()
    t0 = time.monotonic()
    procs = [subprocess.Popen(c.head.argv(*argv, ref, *urls), env=c.head.env(c.head_env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for urls in groups]  # fmt: skip
    outs = [p.communicate(timeout=3600) for p in procs]
    seconds = time.monotonic() - t0
    sent = c.head_tx() - before
    for p, (out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"a push failed ({p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
    return round(seconds, 2), sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--ref", help="an image of this machine's classic engine, pushed whole")
    opts = parser.parse_args()
    from tests.cluster.helpers import make_image

    work = Path(tempfile.mkdtemp(prefix="nodekit-tree-bench."))
    with ShipCluster("nktb", opts.hosts, "classic", work) as c:
        if opts.ref:
            ref, source = opts.ref, CLASSIC_ENGINE
            size = int(c.head.run("docker", "-H", CLASSIC_ENGINE, "image", "inspect", "-f", "{{.Size}}", ref).stdout)
        else:
            ref, source = "nodekit/treebench:current", c.head.docker_host
            make_image(c.head, ref, seed=random.randrange(1 << 30), mib=opts.mib)
            size = opts.mib << 20
        urls = [f"ssh://root@{t.addr}" for t in c.targets]
        one = c.targets[:1]
        c.wipe(one)
        _, copy = pushes(c, ref, source, [urls[:1]], None)  # one host: what one copy costs on the head's link
        rows = {}
        for side, groups, fanout in (
            ("chains", [urls[i : i + CHAIN_MAX] for i in range(0, len(urls), CHAIN_MAX)], 1),
            ("tree", [urls], None),
        ):
            c.wipe(c.targets)
            seconds, sent = pushes(c, ref, source, groups, fanout)
            rows[side] = {"seconds": seconds, "head_link_bytes": sent, "copies": round(sent / copy, 2)}
            print(f"{side}: {len(urls)} hosts in {seconds:.1f} s, {sent / (1 << 20):.1f} MiB on the head's link = "
                  f"{sent / copy:.2f} copies (one copy: {copy / (1 << 20):.1f} MiB)", flush=True)  # fmt: skip
    record = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "hosts": opts.hosts, "image_bytes": size, "ref": ref,
              "one_copy_bytes": copy, **rows, "cpus": os.cpu_count()}  # fmt: skip
    print(json.dumps(record))
    met = rows["tree"]["copies"] <= 1.2
    print(f"tree <= 1.2 copies: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
