"""`make bench` (part): what `nodekit push` costs for the demo image, whole vs after a one-line code change, to 1 and
2 hosts of the virtual cluster (tests/cluster: one network namespace and dockerd per host).

Not a test: it measures and writes its section of docs/benchmarks.md (run after benchmarks/run.py, which writes
the rest of that file). Bytes are what went into each target's `docker load` (PushResult.sent). Targets are the
hosts' local unix sockets: no compression, no SSH, no `tc` link limits, so times are the engines' save and load
work on this machine's 2 shared cores, not a network's. Needs root and a dockerd (make engine).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp"
TITLE = "## Shipping the image: whole vs only the layers a node lacks"


def main() -> int:
    argparse.ArgumentParser(description=__doc__).parse_args()
    sys.path.insert(0, str(ROOT))
    from nodekit import build, settings, ship
    from nodekit.progress import NullReporter
    from nodekit.ship.plan import size_text
    from tests.cluster.conftest import push_image
    from tests.cluster.harness import Cluster, Host

    work = Path(tempfile.mkdtemp(prefix="nodekit-ship-bench-"))
    project = work / "ddp"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("outputs", "compose", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    cfg = project / "nodekit.toml"

    def built() -> str:
        subprocess.run([sys.executable, "-m", "nodekit", "build", "--create-base", "--config", str(cfg)], check=True,
                       env=env, capture_output=True)  # fmt: skip
        return build.current_image(settings.load(cfg))

    v1 = built()
    train = project / "train.py"
    train.write_text(train.read_text() + "\n# one changed line: a code-only rebuild\n")
    v2 = built()
    assert v1 != v2

    def wipe(*hosts: Host) -> None:
        for h in hosts:
            found = h.docker("images", "-q", "--no-trunc", "-a").stdout.split()
            for image_id in sorted(set(found)):
                h.docker("rmi", "-f", image_id, check=False)

    def timed(ref: str, source: str, hosts: list[Host], *, whole: bool = False) -> tuple[float, int, int]:
        """(seconds for the whole push as `nodekit push` does it, bytes to all targets, layers skipped)."""
        t0 = time.monotonic()
        src = ship.source_of(ref, source)
        states = ship.survey(src, [ship.Target(h.name, h.docker_host) for h in hosts])
        if whole:  # today's behaviour before this change: every layer travels
            states = [dataclasses.replace(st, chains=None) for st in states]
        result = ship.push(ship.plan_push(src, states), NullReporter())
        return time.monotonic() - t0, sum(result.sent.values()), sum(result.layers_skipped.values())

    rows: list[tuple[str, int, float, int, int]] = []
    with Cluster(3, name="nkb", owner=os.getpid(), decoy=False) as c:
        try:
            h0, h1, h2 = c.hosts
            push_image(v1, None, [h0])
            push_image(v2, None, [h0])
            n_layers = len(ship.source_of(v2, h0.docker_host).layers)
            for n in (1, 2):
                targets = [h1, h2][:n]
                wipe(*targets)
                rows.append(("whole image, empty node(s)", n, *timed(v1, h0.docker_host, targets)))
                rows.append(("code-only change", n, *timed(v2, h0.docker_host, targets)))
                for h in targets:
                    h.docker("rmi", v2)
                rows.append(("code-only change, whole image sent (before)", n,
                             *timed(v2, h0.docker_host, targets, whole=True)))  # fmt: skip
                print(rows[-3:], flush=True)
            size = ship.source_of(v2, h0.docker_host).size
        finally:
            c.down(purge=True)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    lines = [
        TITLE,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `benchmarks/ship_bench.py` (load {load} at "
        f"the end): the demo image (examples/ddp, {size / 1e6:.0f} MB, {n_layers} layers) pushed from one host of the "
        "virtual cluster to 1 and 2 others, each a dockerd of its own, through nodekit's push (survey, plan, one "
        "`docker save`, filtered, into one `docker load` per target, image id verified). The code-only change is one "
        "line appended to train.py and `nodekit build` again. One run each.",
        "",
        "| push | targets | time | bytes sent (all targets) | layers skipped |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {what} | {n} | {s:.1f} s | {size_text(b)} | {k} |" for what, n, s, b, k in rows),
        "",
        "No `tc` limits and no SSH here: the targets are local unix sockets, so the stream is uncompressed and the",
        "time is Docker's own work on this machine's 2 shared cores. What a code-only push still pays is `docker",
        "save` on the source, which exports every layer before the first byte leaves (the filter drops the layers the",
        "target has from that stream), plus the survey (`docker image inspect` of every image on each target). On a",
        "real link the bytes column is what crosses it: a code-only push sends the code layer, the image config and",
        "the archive's index, whatever the image's size.",
        "",
    ]
    section = "\n".join(lines)
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text()
    if TITLE in text:
        head, _, rest = text.partition(TITLE)
        tail = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
