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
        --nproc-per-node 1 --master-addr MAIN --master-port PORT train.py --epochs 1 --step-times

Both sides run the same image, script and torch. Where nodekit's seconds go (benchmarks/fleet_phases.py): its
progress lines, stamped as they are printed, its run record (each node's phases as the head saw them) and rank 0's
``--step-times`` (main() entered, process group initialised), the same marks as the anchor's.

Results accumulate in ``--state`` (a JSON file; one entry per label and host count, a host count run again
replaces its entry), so host counts measured in separate runs (one heavy-lock hold each) make one table.
``--label before`` writes the "## Before" section of the doc and leaves the rest; any other label writes the top
and keeps that section. Needs root, a dockerd and Debian's openssh-server (make engine sshd).

    .venv/bin/python benchmarks/fleet_bench.py [--pairs 5] [--hosts 1,2,4] [--state F] [--label L] [--no-docs]
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import fleet_phases, stats  # noqa: E402
from benchmarks._headprobe import HeadProbe  # noqa: E402
from benchmarks._project import busy_cpu_s, loadavg, now_utc, read_state, write_state  # noqa: E402

FIRST_STEP = "ddp-demo: first step done"
FINAL = "| final loss "  # rank 0's last line: the job has ended there
LINKS = "nodekit link check: "  # its headline, with its pairs and seconds
BARRIER_GRACE_S = 30.0  # after rank 0's last line, how long bare torchrun may take to end on every host
TARGET_S = 1.5
DOC = ROOT / "docs" / "fleet-bench.md"
BEFORE = "\n## Before"
JOB = ["--epochs", "1", "--step-times"]


class Tail:
    """A log file read as it grows: each complete line with the seconds since ``t0`` when it was read, and the
    machine's busy CPU seconds since ``t0`` when the first line holding ``marker`` was read (:attr:`cpu`)."""

    def __init__(self, path: Path, t0: float, marker: str = FIRST_STEP) -> None:
        self.path, self.t0, self.marker = path, t0, marker
        self.lines: list[tuple[float, str]] = []
        self._pos, self._part = 0, ""
        self._cpu0, self.cpu = busy_cpu_s(), float("nan")

    def poll(self) -> None:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self._pos)
                chunk = f.read()
                self._pos = f.tell()
        except OSError:
            return
        if not chunk:
            return
        now = time.monotonic() - self.t0
        *done, self._part = (self._part + chunk).split("\n")
        self.lines += [(now, ln.rstrip("\r")) for ln in done]
        if math.isnan(self.cpu) and any(self.marker in ln for ln in done):
            self.cpu = busy_cpu_s() - self._cpu0

    def first(self, marker: str) -> float:
        return next((t for t, ln in self.lines if marker in ln), float("nan"))


def until_end(proc: subprocess.Popen[str], tails: Sequence[Tail], timeout: float, probe: Any = None) -> None:
    """Read ``tails`` every 20 ms until ``proc`` ends (it is killed after ``timeout`` s: SystemExit); ``probe`` (a
    benchmarks._headprobe.HeadProbe) sampled every 0.25 s."""
    deadline = time.monotonic() + timeout
    sampled = 0.0
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise SystemExit(f"a run did not end within {timeout:.0f} s: {[str(t.path) for t in tails]}")
        for t in tails:
            t.poll()
        if probe is not None and time.monotonic() - sampled > 0.25:
            probe.sample()
            sampled = time.monotonic()
        time.sleep(0.02)
    for t in tails:
        t.poll()


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def step_marks(outputs: Path, t0: float) -> dict[str, float]:
    f = outputs / "step-times.txt"
    return fleet_phases.train_marks(f.read_text(), t0) if f.is_file() else {}


def kit_run(c: Any, n: int, ref: str, project: Path, port: int, env: dict[str, str], log: Path) -> dict[str, Any]:
    """``nodekit run`` on the first ``n`` hosts, from host 0: its first step and phases (seconds since the command)."""
    shutil.rmtree(project / "outputs", ignore_errors=True)
    argv = [sys.executable, "-m", "nodekit", "run", "--image", ref, "--master-port", str(port),
            "--config", str(project / "nodekit.toml")]  # fmt: skip
    t0_wall, t0 = time.time(), time.monotonic()
    proc = c.main.popen(*argv, env=env, cwd=project, log=log)
    tail = Tail(log, t0)
    probe = HeadProbe(proc.pid)
    until_end(proc, [tail], 600, probe)
    if proc.returncode != 0:
        raise SystemExit(f"nodekit run on {n} host(s) failed:\n{log.read_text()[-3000:]}")
    records = sorted((project / ".nodekit" / "runs").glob("*/run.json"), key=lambda p: p.stat().st_mtime)
    record = json.loads(records[-1].read_text()) if records else {}
    return {
        "t0": t0,
        "first": tail.first(FIRST_STEP),
        "cpu": tail.cpu,
        "head": fleet_phases.head_phases(tail.lines),
        "lines": fleet_phases.first_lines(tail.lines),
        "nodes": fleet_phases.node_phases(record, t0_wall),
        "train": step_marks(project / "outputs", t0),
        "footprint": probe.figures(),
        "links": next((ln.split("] ", 1)[-1] for _, ln in tail.lines if LINKS in ln and "pair(s)" in ln), ""),
        "findings": fleet_phases.finding_kinds(ln for _, ln in tail.lines),
        "finding_lines": fleet_phases.finding_lines(ln for _, ln in tail.lines)[:40],
    }


def bare_run(c: Any, n: int, ref: str, project: Path, port: int, bin_dir: Path, env: dict[str, str],
             out: Path) -> dict[str, Any]:  # fmt: skip
    """Bare torchrun on ``n`` hosts, each started over SSH from the head as the Lambda guide does (one ssh per host,
    at once): rank 0's first step and training marks. Each host runs its own copy of the project (its own outputs)."""
    hosts = c.hosts[:n]
    main = hosts[0]
    procs, logs = [], []
    for h in hosts:
        copy = out / h.name
        shutil.rmtree(copy / "outputs", ignore_errors=True)
        if not copy.exists():
            shutil.copytree(project, copy, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit"))
    t0 = time.monotonic()
    for rank, h in enumerate(hosts):
        remote = (f"docker run --rm --network host --ipc host -e GLOO_SOCKET_IFNAME={h.iface} -v {out / h.name}:"
                  f"/workspace -w /workspace --entrypoint /opt/venv/bin/python {ref} -m torch.distributed.run "
                  f"--nnodes {n} --node-rank {rank} --nproc-per-node 1 --master-addr {main.addr} --master-port {port} "
                  f"train.py {' '.join(JOB)}")  # fmt: skip
        logs.append(out / f"rank{rank}.log")
        procs.append(main.popen(str(bin_dir / "ssh"), f"root@{h.addr}", remote, env=env, log=logs[-1]))
    tail = Tail(logs[0], t0)
    probe = HeadProbe([p.pid for p in procs])  # the same probing as nodekit's side, on this side's head: its ssh
    deadline, sampled = t0 + 600, 0.0
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            print(f"fleet bench: bare torchrun on {n} host(s) did not end within 600 s", flush=True)
            break
        tail.poll()
        if time.monotonic() - sampled > 0.25:
            probe.sample()
            sampled = time.monotonic()
        done = tail.first(FINAL)
        # torchrun's agents meet at an exit barrier after the job; one that leaves it early (seen here: exit 1 on a
        # node whose job had ended well) holds the others there for 300 s. Rank 0's job has ended by then: the
        # first step is measured, so what is left is torchrun's teardown, not the anchor's time to the first step.
        if not math.isnan(done) and time.monotonic() - t0 > done + BARRIER_GRACE_S:
            break
        time.sleep(0.02)
    tail.poll()
    stuck = [h.name for p, h in zip(procs, hosts, strict=True) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for h in hosts if stuck else []:
        if ids := h.docker("ps", "-q").stdout.split():
            h.docker("kill", *ids)
    codes = [p.returncode for p in procs]
    first = tail.first(FIRST_STEP)
    if math.isnan(first) or math.isnan(tail.first(FINAL)):
        raise SystemExit(f"bare torchrun on {n} host(s) failed ({codes}):\n{logs[0].read_text()[-3000:]}")
    if any(codes):
        print(
            f"fleet bench: note: bare torchrun on {n} host(s) trained to its end on rank 0, then ended {codes} "
            f"(stuck in torchrun's exit barrier: {', '.join(stuck) or 'none'}); its first step is kept",
            flush=True,
        )
    return {"t0": t0, "first": first, "cpu": tail.cpu, "train": step_marks(out / main.name / "outputs", t0),
            "footprint": probe.figures()}  # fmt: skip


def configure(cfg: Path, base: str, hosts: Sequence[str], extra: str = "") -> None:
    """The project's nodekit.toml (``base``, as the demo has it) for ``hosts``, with ``extra`` (TOML, e.g. a
    ``[health]`` table) at its end."""
    keep = [ln for ln in base.splitlines() if not ln.startswith(("nnodes =", "hosts =", "args ="))]
    cfg.write_text("\n".join([*keep, f"nnodes = {len(hosts)}", f"hosts = {json.dumps(list(hosts))}",
                              f"args = {json.dumps(JOB)}", extra]) + "\n")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="interleaved pairs per host count (default 5)")
    parser.add_argument("--hosts", default="1,2,4")
    parser.add_argument("--state", type=Path, help="accumulate results here (JSON), across runs")
    parser.add_argument("--label", default="now", help="'before' writes the doc's Before section (default: now)")
    parser.add_argument("--no-docs", action="store_true", help="print the result, do not write docs/")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1, help="runs of each side before the pairs, not counted")
    parser.add_argument("--toml", default="", help="TOML appended to the project's nodekit.toml (a variant, e.g. "
                        "'[health]\\nlinks = \"off\"'); use it with its own --label")  # fmt: skip
    opts = parser.parse_args()
    from benchmarks._project import build, copy_demo, exit_on_signals
    from tests.cluster.harness import Cluster, ssh_client
    from tests.cluster.helpers import push_image

    exit_on_signals()
    # The head runs nodekit as `pip install` leaves it: its modules compiled. Where PYTHONDONTWRITEBYTECODE is set (as
    # on the machine these figures come from) an editable install would otherwise compile them again on every run.
    compileall.compile_dir(ROOT / "nodekit", quiet=1)
    state = read_state(opts.state) if opts.state else {}
    runs: dict[str, Any] = state.setdefault(opts.label, {})
    project = copy_demo("nodekit-fleet-bench-")
    work = project.parent
    ref = build(project, quiet=True)
    base = (project / "nodekit.toml").read_text()
    counts = [int(n) for n in opts.hosts.split(",")]
    load_start = loadavg()
    try:
        with Cluster(max(counts), name="nkf", owner=os.getpid(), decoy=False) as c:
            push_image(ref, None, [c.main])
            push_image(ref, c.main.docker_host, c.hosts[1:])
            host_key, client_key = keygen(work / "host"), keygen(work / "client")
            bin_dir = ssh_client(work / "ssh", c.hosts, client_key, host_key.with_suffix(".pub").read_text())
            for h in c.hosts:
                h.start_sshd(client_key.with_suffix(".pub").read_text(), host_key)
            # Unbuffered: each progress line is written, and stamped, when it is printed; wide: never wrapped.
            env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": "", "PYTHONUNBUFFERED": "1",
                   "COLUMNS": "400"}  # fmt: skip
            try:
                for n in counts:
                    hosts = [f"ssh://root@{h.addr}" for h in c.hosts[:n]]
                    configure(project / "nodekit.toml", base, hosts, opts.toml.replace("\\n", "\n"))
                    kit: list[dict[str, Any]] = []
                    bare: list[dict[str, Any]] = []
                    t_n = time.monotonic()
                    # One run of each side first, not counted: the first container after the image arrived reads
                    # the image's files from disk (a cold page cache), which no later run of either side pays.
                    for _ in range(opts.warmup):
                        kit_run(c, n, ref, project, 29690, env, work / f"kit-{n}-warm.log")
                        bare_run(c, n, ref, project, 29691, bin_dir, env, work / f"bare-{n}")
                    for i in range(opts.pairs):
                        for side in ("kit", "bare") if i % 2 == 0 else ("bare", "kit"):
                            port = 29700 + (i * 2 + (side == "bare")) % 40
                            if side == "kit":
                                kit.append(kit_run(c, n, ref, project, port, env, work / f"kit-{n}-{i}.log"))
                            else:
                                bare.append(bare_run(c, n, ref, project, port, bin_dir, env, work / f"bare-{n}"))
                        print(f"fleet bench: {n} host(s), pair {i + 1}: nodekit {kit[-1]['first']:.2f} s "
                              f"({kit[-1]['cpu']:.1f} CPU s), bare {bare[-1]['first']:.2f} s "
                              f"({bare[-1]['cpu']:.1f} CPU s)", flush=True)  # fmt: skip
                    runs[str(n)] = {"kit": kit, "bare": bare, "measured": now_utc(), "load_start": load_start,
                                    "load_end": loadavg(), "minutes": (time.monotonic() - t_n) / 60,
                                    "warmup": opts.warmup}  # fmt: skip
                    if opts.state:
                        write_state(opts.state, state)
            finally:
                for h in c.hosts:
                    h.stop_sshd()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = render(runs, opts.label, seed=opts.seed)
    print(text)
    if not opts.no_docs:
        write(text, before=opts.label == "before")
    return 0


def render(runs: Mapping[str, Any], label: str, *, seed: int = 1) -> str:
    """The doc's text for one label's results: the verdict per host count, then where the seconds go."""
    rows, phases, notes = [], [], []
    for key in sorted(runs, key=int):
        r = runs[key]
        rows.append(fleet_phases.first_step_row(key, r, TARGET_S, seed=seed))
        phases.append(fleet_phases.breakdown_row(int(key), r["kit"], r["bare"]))
        warm = f" after {r['warmup']} run(s) of each side not counted" if r.get("warmup") else ""
        notes.append(f"{key} host(s): {len(r['kit'])} pairs{warm}, measured {r['measured']}, load {r['load_start']} "
                     f"at the start and {r['load_end']} at the end, {r['minutes']:.1f} minutes")  # fmt: skip
        if feet := [x["footprint"] for x in r["kit"] if "footprint" in x]:
            med = {k: stats.median([f[k] for f in feet]) for k in feet[0]}
            links = next((x["links"] for x in r["kit"] if x.get("links")), "not in the log")
            notes.append(f"{key} host(s), the head (median of the nodekit runs; it, its children and its connections' "
                         f"masters): {med['cpu_s']:.1f} CPU s for the whole run, peak {med['rss_mb']:.0f} MB resident, "
                         f"{med['fds']:.0f} open files, {med['procs']:.0f} processes (its own process: "
                         f"{med['head_fds']:.0f} open files); the link check: {links}")  # fmt: skip
    title = "## Before (issue 33: as measured before its changes)" if label == "before" else (
        "# `nodekit run`: command to first training step, against bare torchrun over SSH")  # fmt: skip
    return "\n".join([
        title,
        "",
        f"Measured by `benchmarks/fleet_bench.py` on the virtual cluster (one machine, {os.cpu_count()} cores shared "
        "by every host): every host a network namespace with its own dockerd and sshd, reached over real SSH; the "
        "image already on every host; examples/ddp with one epoch; interleaved pairs per host count (the order "
        "alternates). "
        "The anchor is bare torchrun started on every host over SSH as the Lambda guide does (`ssh HOST docker run "
        "... python -m torch.distributed.run --nnodes N --node-rank R --master-addr MAIN ...`), each host's gloo "
        "interface named by hand (GLOO_SOCKET_IFNAME), which nodekit finds by itself.",
        "",
        *(f"- {n}" for n in notes),
        "",
        f"Target (issue 33): nodekit within +{TARGET_S:g} s of bare torchrun, decided on the 95% bootstrap interval of "
        "the difference of the medians (met only when the whole interval is at or below it).",
        "",
        "| hosts | bare torchrun: first step, median (runs) | nodekit run: first step, median (runs) | difference "
        "[95% interval] | verdict | machine CPU s to the first step, bare / nodekit (median) |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Where the seconds go (median second since the command of each phase; where each node has its own, the "
        "earliest to the latest node). The head's steps are `nodekit run`'s progress lines; a node's phases are "
        "those its run record holds (`nodekit runs show`: when the head saw its container started, the launcher's "
        "preflight report, torchrun's rendezvous line, the job's first line); rank 0's marks are train.py's "
        "`--step-times` (main() entered after the worker imported torch, the process group initialised). The machine's "
        "CPU seconds are /proc/stat's busy time over the same interval: on this machine every host, the head and "
        "the containers share its cores, so what one side does beyond the other delays its first step by about that "
        "difference divided by the cores.",
        "",
        fleet_phases.BREAKDOWN_HEADER,
        *phases,
        "",
    ])  # fmt: skip


def write(text: str, *, before: bool) -> None:
    """``text`` as the doc's top (the Before section kept), or as its Before section (the top kept)."""
    old = DOC.read_text() if DOC.is_file() else ""
    top, sep, rest = old.partition(BEFORE)
    if before:
        DOC.write_text(top.rstrip("\n") + "\n\n" + text)
    else:
        DOC.write_text(text + (BEFORE + rest if sep else ""))


if __name__ == "__main__":
    sys.exit(main())
