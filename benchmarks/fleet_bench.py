"""`make bench` (part): `nodekit run` on a head node, from the command to the first training step, for 1, 2 and 3
hosts of the virtual cluster (tests/cluster: one network namespace, dockerd and sshd per host), over real SSH.

Not a test: it measures and writes docs/fleet-bench.md. The image is on every host before the timed runs (shipping
is measured by the push benchmark), so what is timed is what every run pays: checks and facts over SSH, compose
files, starts, the launcher's preflight, torch's rendezvous, up to the line rank 0 prints after its first step.
Needs root, a dockerd and Debian's openssh-server (make engine sshd).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_STEP = "ddp-demo: first step done"


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def timed_run(head: object, project: Path, ref: str, env: dict[str, str], log: Path) -> tuple[float, float, int]:
    """(seconds to the first step, seconds to the end, exit code) of one `nodekit run` on the head."""
    argv = [sys.executable, "-m", "nodekit", "run", "--image", ref, "--config", str(project / "nodekit.toml")]
    t0 = time.monotonic()
    proc = head.popen(*argv, env=env, cwd=project, log=log)  # type: ignore[attr-defined]
    first = float("nan")
    while proc.poll() is None:
        if first != first and FIRST_STEP in log.read_text(errors="replace"):
            first = time.monotonic() - t0
        time.sleep(0.05)
    if first != first and FIRST_STEP in log.read_text(errors="replace"):
        first = time.monotonic() - t0
    return first, time.monotonic() - t0, proc.returncode


def _seconds(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--hosts", default="1,2,3")
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks._project import build, copy_demo
    from tests.cluster.conftest import push_image
    from tests.cluster.harness import Cluster, ssh_client

    project = copy_demo("nodekit-fleet-bench-")
    work = project.parent
    cfg = project / "nodekit.toml"
    ref = build(project)
    counts = [int(n) for n in opts.hosts.split(",")]
    rows = []
    with Cluster(max(counts), name="nkt", owner=os.getpid()) as c:
        push_image(ref, None, [c.main])
        push_image(ref, c.main.docker_host, c.hosts[1:])
        host_key, client_key = keygen(work / "host"), keygen(work / "client")
        bin_dir = ssh_client(work / "ssh", c.hosts, client_key, host_key.with_suffix(".pub").read_text())
        for h in c.hosts:
            h.start_sshd(client_key.with_suffix(".pub").read_text(), host_key)
        path = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        try:
            for n in counts:
                base = cfg.read_text().splitlines()
                keep = [ln for ln in base if not ln.startswith(("nnodes =", "hosts =", "args ="))]
                hosts = [f"ssh://root@{h.addr}" for h in c.hosts[:n]]
                extra = [f"nnodes = {n}", f"hosts = {json.dumps(hosts)}", 'args = ["--epochs", "1"]']
                cfg.write_text("\n".join(keep + extra) + "\n")
                firsts, totals, ready, started = [], [], [], []
                for rep in range(opts.reps):
                    first, total, code = timed_run(c.main, project, ref, path, work / f"run-{n}-{rep}.log")
                    if code != 0:
                        print((work / f"run-{n}-{rep}.log").read_text()[-3000:])
                        raise SystemExit(f"nodekit run on {n} host(s) failed with {code}")
                    firsts.append(first)
                    totals.append(total)
                    text = (work / f"run-{n}-{rep}.log").read_text(errors="replace")
                    ready.append(_seconds(r"host\(s\) ready \(([0-9.]+) s\)", text))
                    started.append(_seconds(r"node\(s\) started \(([0-9.]+) s since", text))
                rows.append(
                    (n, statistics.median(ready), statistics.median(started), statistics.median(firsts),
                     min(firsts), max(firsts), statistics.median(totals))
                )  # fmt: skip
                print(f"{n} host(s): first step after {statistics.median(firsts):.1f} s (median of {opts.reps})")
        finally:
            for h in c.hosts:
                h.stop_sshd()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    lines = [
        "# `nodekit run`: command to first training step",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `benchmarks/fleet_bench.py` on the virtual "
        f"cluster (one machine, {os.cpu_count()} cores, load {load} at the end): every host a network namespace with "
        "its own dockerd and sshd, reached over real SSH. The image is already on every host. Median of "
        f"{opts.reps} runs; examples/ddp with one epoch.",
        "",
        "| hosts | hosts checked | all started | first step (median) | min | max | whole run (median) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {n} | {r:.1f} s | {st:.1f} s | {m:.1f} s | {lo:.1f} s | {hi:.1f} s | {t:.1f} s |"
            for n, r, st, m, lo, hi, t in rows
        ),
        "",
        '"hosts checked" and "all started" are nodekit\'s own share (SSH checks and facts, the image survey, the',
        "compose files, `docker compose up` on every host), read from `nodekit run`'s progress lines. The rest, up to",
        "the first step, is inside the containers: the launcher importing torch, torchrun starting the worker (which",
        "imports torch again), the rendezvous and gloo's setup.",
        "",
        "All hosts share these 2 cores, so every extra host also adds a torch import and a container start to the",
        "same CPUs: on real machines those run in parallel and the growth with hosts is the SSH round trips only.",
        "",
    ]
    (ROOT / "docs" / "fleet-bench.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
