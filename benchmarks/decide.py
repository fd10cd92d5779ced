"""`make bench DECIDE=1`: the benchmark that decides (issue 13). Bare torchrun and nodekit on the same 2-node job,
interleaved (ABAB...), each run split into phases, CPU time beside wall time, and a verdict per target from a
bootstrap 95% interval: met, missed, or undecided.

    .venv/bin/python benchmarks/decide.py [--reps 10] [--epochs 30] [--cli-reps 10] [--write-docs]

Needs the example's image (`nodekit build`), a Docker engine, and a host virtual environment with torch
(benchmarks/run.py makes it). Not a test; run it on a quiet machine. The method is in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import phases, stats  # noqa: E402
from benchmarks.run import EXAMPLE, PORT, bare_venv  # noqa: E402

# The targets: (statistic, target, how nodekit is compared with bare).
TARGET_STEP_RATIO = 1.02
TARGET_FIRST_STEP_DIFF_S = 1.5
TARGET_WHOLE_RATIO = 1.05
TARGET_CLI_S = 0.5
TARGET_UP_TO_START_S = 1.0
TARGET_PREFLIGHT_S = 0.3
POLL_S = 0.02
DOCS_BEGIN = "<!-- decide:begin{} -->"
DOCS_END = "<!-- decide:end{} -->"


@dataclass
class Run:
    side: str
    phases: phases.Phases
    cpu_s: float
    detail: dict[str, Any] = field(default_factory=dict)


def _wait_cpu(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Exit code and user+system CPU seconds of ``proc`` and the descendants it waited for (torchrun waits for its
    workers), from wait4's rusage: exact, and blind to every other process on the machine."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def run_bare(py: Path, train_args: list[str], out: Path) -> Run:
    """Two torchrun processes (node 0 and 1) on 127.0.0.1, started together."""
    shutil.rmtree(out, ignore_errors=True)
    torchrun = py.parent.absolute() / "torchrun"  # absolute: Popen resolves a relative one against cwd
    env = os.environ | {"NODEKIT_OUTPUT_DIR": str(out), "GLOO_SOCKET_IFNAME": "lo"}
    rdzv = ["--master-addr", "127.0.0.1", "--master-port", str(PORT)]
    argvs = [[str(torchrun), "--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "1", *rdzv] for r in (0, 1)]
    quiet = subprocess.DEVNULL
    t_cmd = time.monotonic()
    procs = [subprocess.Popen([*argv, "train.py", *train_args], cwd=EXAMPLE, env=env, stdout=quiet, stderr=quiet)
             for argv in argvs]  # fmt: skip
    waited = [_wait_cpu(p) for p in procs]
    t_exit = time.monotonic()
    if any(code for code, _ in waited):
        raise SystemExit(f"bare torchrun failed: exit codes {[c for c, _ in waited]}")
    steps = phases.parse_step_times((out / phases.STEP_TIMES_FILE).read_text())
    return Run("bare", phases.split(t_cmd, t_exit, steps), sum(cpu for _, cpu in waited))


class CgroupCpu(threading.Thread):
    """Follows one container's CPU counter until its cgroup empties or disappears. The counter is cumulative, so
    a late start loses nothing; what can be lost is the CPU between the last read and the exit, at most one poll
    interval (``exact`` says the last read saw an empty cgroup, i.e. the final value)."""

    def __init__(self, container_id: str, root: str = "/sys/fs/cgroup") -> None:
        super().__init__(daemon=True)
        found = [(p, k) for p, k in phases.cgroup_cpu_files(container_id, root) if Path(p).is_file()]
        self.where = found[0] if found else None
        if self.where is None:
            print(f"decide: no CPU counter found for container {container_id[:12]}; its CPU time is NaN",
                  file=sys.stderr)  # fmt: skip
        self.cpu_s = float("nan")
        self.exact = False

    def run(self) -> None:
        if self.where is None:
            return
        counter = Path(self.where[0])
        procs = counter.with_name("cgroup.procs")
        while True:
            try:
                empty = procs.read_text().strip() == ""
                self.cpu_s = phases.parse_cpu(counter.read_text(), self.where[1])
            except OSError:
                return  # the cgroup is gone: the last value read stands
            if empty:
                self.exact = True
                return
            time.sleep(POLL_S)


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


def run_nodekit(config: Path, train_args: list[str], out: Path) -> Run:
    """`nodekit up -d` for node 1 and node 0 at once, then until both containers exited (as benchmarks/run.py)."""
    from nodekit.backends.compose.node import compose_path, project_for
    from nodekit.config.settings import load
    from nodekit.system import docker

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings = load(config)
    flags = ["--main", "127.0.0.1", "--master-port", str(PORT), "--detach", "--config", str(config)]
    env = os.environ | {"NODEKIT_ARGS": json.dumps(train_args), "NODEKIT_OUTPUT_DIR": str(out)}
    argv = [*_nodekit(), "up", *flags]
    t_wall, t_cmd = time.time(), time.monotonic()
    ups = [subprocess.Popen([*argv, "--node-rank", str(r)], env=env, stdout=subprocess.DEVNULL) for r in (1, 0)]
    waited = [_wait_cpu(p) for p in ups]
    try:
        if any(code for code, _ in waited):
            raise SystemExit(f"nodekit up failed: exit codes {[c for c, _ in waited]}")
        projects = {r: project_for(settings, r) for r in (0, 1)}
        ids = {r: _docker("ps", "-aq", "--no-trunc", "--filter", f"label=com.docker.compose.project={p}").split()
               for r, p in projects.items()}  # fmt: skip
        if any(len(v) != 1 for v in ids.values()):
            raise SystemExit(f"expected one container per node, found {ids}")
        meters = {r: CgroupCpu(v[0]) for r, v in ids.items()}
        for m in meters.values():
            m.start()
        codes = [docker.compose_wait(compose_path(settings, r), projects[r]) for r in (0, 1)]
        t_seen = time.monotonic()
        for m in meters.values():
            m.join(timeout=5)
        times = [_docker("inspect", "-f", "{{.State.StartedAt}} {{.State.FinishedAt}}", v[0]).split()
                 for v in ids.values()]  # fmt: skip
        started = [phases.parse_docker_time(t[0]) for t in times]
        # The exit is the engine's own record of it, as wait4 is bare's: `compose wait` is a CLI started per node,
        # one after the other, which sees the second exit up to half a second late (measured, not the job's cost).
        t_exit = t_cmd + max(phases.parse_docker_time(t[1]) for t in times) - t_wall
        logs = {r: subprocess.run(["docker", "logs", v[0]], capture_output=True, text=True, check=False)
                for r, v in ids.items()}  # fmt: skip
        if any(codes):
            for r, log in logs.items():
                print(f"--- node {r} ---\n{(log.stdout + log.stderr)[-2000:]}", file=sys.stderr)
            raise SystemExit(f"nodekit run failed: exit codes {codes}")
    finally:
        # Also after a failure: a container left behind would hold the port for every later run.
        for rank in (0, 1):
            subprocess.run([*_nodekit(), "down", "--node-rank", str(rank), "--config", str(config)],
                           check=False, stdout=subprocess.DEVNULL, env=env)  # fmt: skip
    steps = phases.parse_step_times((out / phases.STEP_TIMES_FILE).read_text())
    cli_cpu = sum(cpu for _, cpu in waited)
    container_cpu = sum(m.cpu_s for m in meters.values())
    detail = {
        "cpu_cli_s": cli_cpu,
        "cpu_containers_s": container_cpu,
        "cpu_exact": all(m.exact for m in meters.values()),
        "cgroup_files": [m.where for m in meters.values()],
        "up_to_container_start_s": max(started) - t_wall,
        "exit_seen_by_compose_wait_s": t_seen - t_exit,
        "preflight_s": {r: phases.parse_preflight(p.stdout + p.stderr) for r, p in logs.items()},
        "preflight_settled_s": {r: phases.parse_preflight_settled(p.stdout + p.stderr) for r, p in logs.items()},
    }
    return Run("nodekit", phases.split(t_cmd, t_exit, steps), cli_cpu + container_cpu, detail)


def _nodekit() -> list[str]:
    script = Path(sys.executable).with_name("nodekit")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "nodekit"]


def time_cli(argv: list[str], reps: int) -> list[float]:
    """Seconds of a whole command, Python start-up included: what a user waits."""
    times = []
    for _ in range(reps):
        t = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.monotonic() - t)
    return times


@dataclass(frozen=True)
class Row:
    phase: str
    unit: str
    bare: float | None
    nodekit: float
    compared: str  # "ratio", "difference" or "nodekit" (nodekit's own median)
    interval: stats.Interval
    verdict: stats.Verdict | None


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.2f} ms" if unit == "ms" else f"{x:.3f} s"


def rows(bare: list[Run], kit: list[Run], cli: dict[str, list[float]], seed: int | None) -> list[Row]:
    """The phase table: medians, the 95% interval of nodekit against bare, and a verdict where the issue sets a
    target. Pure given the runs."""

    def pair(name: str, unit: str, key: str, compared: str, target: float | None) -> Row:
        a = [getattr(r.phases, key) if key != "cpu" else r.cpu_s for r in bare]
        b = [getattr(r.phases, key) if key != "cpu" else r.cpu_s for r in kit]
        if compared == "ratio":
            iv = stats.ratio_of_medians(a, b, seed=seed)
        else:
            iv = stats.difference_of_medians(a, b, seed=seed)
        return Row(name, unit, stats.median(a), stats.median(b), compared, iv,
                   stats.verdict(iv, target) if target is not None else None)  # fmt: skip

    def own(name: str, xs: list[float], target: float | None) -> Row:
        iv = stats.median_interval(xs, seed=seed)
        return Row(name, "s", None, stats.median(xs), "nodekit", iv,
                   stats.verdict(iv, target) if target is not None else None)  # fmt: skip

    out = [
        pair("command -> train.py main()", "s", "to_main", "difference", None),
        pair("command -> process group ready", "s", "to_init", "difference", None),
        pair("time to first step", "s", "startup", "difference", TARGET_FIRST_STEP_DIFF_S),
        pair("per step (median interval)", "ms", "per_step", "ratio", TARGET_STEP_RATIO),
        pair("training loop (first -> last step)", "s", "loop", "ratio", None),
        pair("teardown (last step -> exit)", "s", "teardown", "difference", None),
        pair("whole job", "s", "whole", "ratio", TARGET_WHOLE_RATIO),
        pair("CPU time, user+system", "s", "cpu", "ratio", None),
        own(
            "nodekit up -> container started", [r.detail["up_to_container_start_s"] for r in kit], TARGET_UP_TO_START_S
        ),
    ]
    pre = [r.detail["preflight_s"].get(0) for r in kit]
    if all(p is not None for p in pre):
        out.append(
            own(
                "preflight on main, whole (torch import and the wait for nodes included)", [float(p) for p in pre], None
            )
        )
    settled = [r.detail.get("preflight_settled_s", {}).get(0) for r in kit]
    if all(p is not None for p in settled):
        out.append(
            own(
                "preflight's own cost on main (once every node was there)",
                [float(p) for p in settled],
                TARGET_PREFLIGHT_S,
            )
        )
    out += [own(name, xs, TARGET_CLI_S) for name, xs in cli.items()]
    return out


def table(rs: list[Row]) -> str:
    lines = [
        "| phase | bare torchrun (median) | nodekit (median) | nodekit vs bare, 95% interval | target | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rs:
        iv = r.interval
        if r.compared == "ratio":
            cmp, target = f"x{iv.estimate:.3f} [{iv.low:.3f}, {iv.high:.3f}]", "<= x{:.2f}"
        elif r.compared == "difference":
            cmp, target = f"{iv.estimate:+.3f} s [{iv.low:+.3f}, {iv.high:+.3f}]", "<= +{:.1f} s"
        else:
            cmp, target = f"median {iv.estimate:.3f} s [{iv.low:.3f}, {iv.high:.3f}]", "< {:.1f} s"
        v = r.verdict
        lines.append(
            f"| {r.phase} | {_fmt(r.bare, r.unit)} | {_fmt(r.nodekit, r.unit)} | {cmp} | "
            f"{target.format(v.target) if v else '-'} | {f'**{v.text}**' if v else '-'} |"
        )
    return "\n".join(lines)


def splice(doc: str, block: str, key: str = "") -> str:
    """``doc`` with the text between the decide markers of ``key`` (one block per job length) replaced by
    ``block``; the markers are appended when absent."""
    first, last = DOCS_BEGIN.format(key), DOCS_END.format(key)
    wrapped = f"{first}\n{block.strip()}\n{last}"
    begin, end = doc.find(first), doc.find(last)
    if begin == -1 or end < begin:
        return doc.rstrip("\n") + "\n\n" + wrapped + "\n"
    return doc[:begin] + wrapped + doc[end + len(last) :]


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=10, help="runs of each side, interleaved (ABAB...)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded pairs first (page cache, images)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--cli-reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (the table is reproducible)")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/benchmarks.md")
    opts = parser.parse_args()
    if opts.reps < 2:
        parser.error("--reps must be at least 2: one run per side has no interval")
    work = ROOT / ".nodekit" / "decide"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    load_at_start = _load()
    config = EXAMPLE / "nodekit.toml"
    subprocess.run([*_nodekit(), "build", "--config", str(config)], check=True)
    py = bare_venv()
    train_args = ["--epochs", str(opts.epochs), "--step-times"]
    bare: list[Run] = []
    kit: list[Run] = []
    for i in range(opts.warmup + opts.reps):
        b = run_bare(py, train_args, work / "bare")
        k = run_nodekit(config, train_args, work / "nodekit")
        tag = "warm-up" if i < opts.warmup else f"{i - opts.warmup + 1}/{opts.reps}"
        print(f"{tag}: bare {b.phases.whole:.2f} s, nodekit {k.phases.whole:.2f} s", flush=True)
        if i >= opts.warmup:
            bare.append(b)
            kit.append(k)
    dry = ["up", "--dry-run", "--node-rank", "0", "--main", "127.0.0.1", "--config", str(config)]
    cli = {
        "`nodekit --help`": time_cli([*_nodekit(), "--help"], opts.cli_reps),
        "`nodekit up --dry-run`": time_cli([*_nodekit(), *dry], opts.cli_reps),
    }
    rs = rows(bare, kit, cli, opts.seed)
    head = (
        f"Written by `make bench DECIDE=1` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPUs, load {load_at_start} at start, {_load()} at the end): `--epochs {opts.epochs}`, "
        f"{opts.reps} runs per side interleaved after {opts.warmup} warm-up pair(s), {opts.cli_reps} runs of each "
        "command; "
        f"bootstrap seed {opts.seed}."
    )
    text = f"{head}\n\n{table(rs)}\n"
    raw = {
        "epochs": opts.epochs,
        "bare": [{"phases": asdict(r.phases), "cpu_s": r.cpu_s} for r in bare],
        "nodekit": [{"phases": asdict(r.phases), "cpu_s": r.cpu_s, **r.detail} for r in kit],
        "cli": cli,
    }
    (ROOT / ".nodekit" / f"decide-{opts.epochs}.json").write_text(json.dumps(raw, indent=2, default=str))
    if opts.write_docs:
        doc = ROOT / "docs" / "benchmarks.md"
        doc.write_text(splice(doc.read_text(), text, key=f" epochs={opts.epochs}"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
