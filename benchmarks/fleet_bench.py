"""`make bench` (part): `nodekit run` against bare torchrun started over SSH, from the command to rank 0's first
training step, at 1, 2 and 4 hosts of the virtual cluster (tests/cluster: one network namespace, dockerd and sshd per
host), measured in interleaved pairs in the same run, with a 95% interval and a verdict per host count (issue 33:
within +1.5 s of bare torchrun).

Not a test: it measures and writes docs/fleet-bench.md. The image is on every host before the timed runs (shipping
is measured by the push benchmark), so what is timed is what every run pays. The anchor is what a user of the
Lambda guide runs on every host over SSH, with what nodekit finds by itself (each host's interface for gloo) given by
hand:

    ssh root@HOST docker run --rm --network host --ipc host -e GLOO_SOCKET_IFNAME=IFACE -v PROJECT:/workspace \\
        -w /workspace --entrypoint /opt/venv/bin/python IMAGE -m torch.distributed.run --nnodes N --node-rank R \\
        --nproc-per-node 1 --master-addr MAIN --master-port PORT train.py --epochs 1

Both sides run the same image, script and torch. nodekit's own timestamps (``nodekit run``'s progress lines, and
its run record when there is one) give where its extra seconds go. Needs root, a dockerd and Debian's openssh-server
(make engine sshd).

    .venv/bin/python benchmarks/fleet_bench.py [--pairs 5] [--hosts 1,2,4] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import stats  # noqa: E402

FIRST_STEP = "ddp-demo: first step done"
TARGET_S = 1.5
DOC = ROOT / "docs" / "fleet-bench.md"
PHASES = (
    ("hosts checked", r"host\(s\) ready \(([0-9.]+) s\)"),
    ("all started", r"node\(s\) started \(([0-9.]+) s since"),
)


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def until_first_step(proc: subprocess.Popen[str], logs: Sequence[Path], t0: float, timeout: float) -> float:
    """Seconds from ``t0`` until one of ``logs`` shows rank 0's first step; the process then runs to its end."""
    first = float("nan")
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        if first != first and any(FIRST_STEP in p.read_text(errors="replace") for p in logs if p.exists()):
            first = time.monotonic() - t0
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    if first != first and any(FIRST_STEP in p.read_text(errors="replace") for p in logs if p.exists()):
        first = time.monotonic() - t0
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(f"a run did not end within {timeout:.0f} s: {[str(p) for p in logs]}") from None
    return first


@dataclass
class Side:
    firsts: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)


def seconds(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="interleaved pairs per host count (default 5)")
    parser.add_argument("--hosts", default="1,2,4")
    parser.add_argument("--no-docs", action="store_true", help="print the result, do not write docs/")
    parser.add_argument("--seed", type=int, default=1)
    opts = parser.parse_args()
    from benchmarks._project import build, copy_demo
    from tests.cluster.conftest import push_image
    from tests.cluster.harness import Cluster, ssh_client

    project = copy_demo("nodekit-fleet-bench-")
    work = project.parent
    cfg = project / "nodekit.toml"
    ref = build(project, quiet=True)
    counts = [int(n) for n in opts.hosts.split(",")]
    results: dict[int, tuple[Side, Side]] = {}
    t_start = time.monotonic()
    with Cluster(max(counts), name="nkf", owner=os.getpid(), decoy=False) as c:
        push_image(ref, None, [c.main])
        push_image(ref, c.main.docker_host, c.hosts[1:])
        host_key, client_key = keygen(work / "host"), keygen(work / "client")
        bin_dir = ssh_client(work / "ssh", c.hosts, client_key, host_key.with_suffix(".pub").read_text())
        for h in c.hosts:
            h.start_sshd(client_key.with_suffix(".pub").read_text(), host_key)
        env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": ""}
        try:
            for n in counts:
                base = cfg.read_text().splitlines()
                keep = [ln for ln in base if not ln.startswith(("nnodes =", "hosts =", "args ="))]
                hosts = [f"ssh://root@{h.addr}" for h in c.hosts[:n]]
                cfg.write_text("\n".join([*keep, f"nnodes = {n}", f"hosts = {json.dumps(hosts)}",
                                          'args = ["--epochs", "1"]']) + "\n")  # fmt: skip
                kit, bare = Side(), Side()
                for i in range(opts.pairs):
                    order = ("kit", "bare") if i % 2 == 0 else ("bare", "kit")
                    for side in order:
                        port = 29700 + (i * 2 + (side == "bare")) % 40
                        if side == "kit":
                            log = work / f"kit-{n}-{i}.log"
                            argv = [sys.executable, "-m", "nodekit", "run", "--image", ref, "--master-port", str(port),
                                    "--config", str(cfg)]  # fmt: skip
                            t0 = time.monotonic()
                            proc = c.main.popen(*argv, env=env, cwd=project, log=log)
                            kit.firsts.append(until_first_step(proc, [log], t0, 600))
                            if proc.returncode != 0:
                                raise SystemExit(f"nodekit run on {n} host(s) failed:\n{log.read_text()[-3000:]}")
                            text = log.read_text(errors="replace")
                            for name, pattern in PHASES:
                                kit.phases.setdefault(name, []).append(seconds(pattern, text))
                        else:
                            bare.firsts.append(bare_run(c, n, ref, project, port, bin_dir, env, work / f"bare-{n}-{i}"))
                    print(f"fleet bench: {n} host(s), pair {i + 1}: nodekit {kit.firsts[-1]:.2f} s, bare "
                          f"{bare.firsts[-1]:.2f} s", flush=True)  # fmt: skip
                results[n] = (kit, bare)
        finally:
            for h in c.hosts:
                h.stop_sshd()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    text = render(results, opts, load=load, minutes=(time.monotonic() - t_start) / 60)
    print(text)
    if not opts.no_docs:
        write(text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def bare_run(c: object, n: int, ref: str, project: Path, port: int, bin_dir: Path, env: dict[str, str],
             out: Path) -> float:  # fmt: skip
    """Bare torchrun on ``n`` hosts, each started over SSH from the head as the Lambda guide does (one ssh per host,
    at once); seconds to rank 0's first step. Each host runs its own copy of the project (its own outputs)."""
    hosts = c.hosts[:n]  # type: ignore[attr-defined]
    main = hosts[0]
    procs, logs = [], []
    t0 = time.monotonic()
    for rank, h in enumerate(hosts):
        copy = out / h.name
        if not copy.exists():
            shutil.copytree(project, copy, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit"))
        remote = (f"docker run --rm --network host --ipc host -e GLOO_SOCKET_IFNAME={h.iface} -v {copy}:/workspace "
                  f"-w /workspace --entrypoint /opt/venv/bin/python {ref} -m torch.distributed.run --nnodes {n} "
                  f"--node-rank {rank} --nproc-per-node 1 --master-addr {main.addr} --master-port {port} "
                  "train.py --epochs 1")  # fmt: skip
        log = out / f"rank{rank}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        logs.append(log)
        procs.append(main.popen(str(bin_dir / "ssh"), f"root@{h.addr}", remote, env=env, log=log))
    first = until_first_step(procs[0], logs[:1], t0, 600)
    for p in procs[1:]:
        p.wait(timeout=600)
    codes = [p.returncode for p in procs]
    if any(codes):
        raise SystemExit(f"bare torchrun on {n} host(s) failed ({codes}):\n{logs[0].read_text()[-3000:]}")
    return first


def render(results: dict[int, tuple[Side, Side]], opts: argparse.Namespace, *, load: str, minutes: float) -> str:
    rows = []
    for n, (kit, bare) in sorted(results.items()):
        diff = stats.difference_of_medians(bare.firsts, kit.firsts, seed=opts.seed)
        verdict = stats.verdict(diff, TARGET_S)
        phases = "; ".join(f"{name} {stats.median([x for x in xs if x == x]):.1f} s" for name, xs in kit.phases.items()
                           if any(x == x for x in xs))  # fmt: skip
        rows.append(
            f"| {n} | {stats.median(bare.firsts):.2f} s | {stats.median(kit.firsts):.2f} s | {diff.estimate:+.2f} s "
            f"[{diff.low:+.2f}, {diff.high:+.2f}] | {verdict.text} | {phases} |"
        )
    return "\n".join([
        "# `nodekit run`: command to first training step, against bare torchrun over SSH",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `benchmarks/fleet_bench.py` on the virtual "
        f"cluster (one machine, {os.cpu_count()} cores, load {load} at the end; {minutes:.0f} minutes): every host a "
        "network namespace with its own dockerd and sshd, reached over real SSH; the image already on every host; "
        f"examples/ddp with one epoch; {opts.pairs} interleaved pairs per host count (the order alternates). The "
        "anchor is bare torchrun started on every host over SSH as the Lambda guide does (`ssh HOST docker run ... "
        "python -m torch.distributed.run --nnodes N --node-rank R --master-addr MAIN ...`), each host's gloo "
        "interface named by hand (GLOO_SOCKET_IFNAME), which nodekit finds by itself.",
        "",
        f"Target (issue 33): nodekit within +{TARGET_S:g} s of bare torchrun, decided on the 95% bootstrap interval of "
        "the difference of the medians (met only when the whole interval is at or below it).",
        "",
        "| hosts | bare torchrun (median) | nodekit run (median) | difference [95% interval] | verdict | nodekit's own "
        "phases (median, since the command) |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Reproduce: `sudo .venv/bin/python benchmarks/fleet_bench.py` (make bench runs it).",
        "",
    ])  # fmt: skip


def write(text: str) -> None:
    old = DOC.read_text() if DOC.is_file() else ""
    keep = old.split("\n## Before", 1)
    DOC.write_text(text + ("\n## Before" + keep[1] if len(keep) == 2 else ""))


if __name__ == "__main__":
    sys.exit(main())
