"""The launcher's entry point: parse, print the start line, check, preflight, then carry out the launch style's
plan the way its :class:`~nodekit.launcher.plan.Runs` says. See the package docstring."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nodekit.launcher import checks, ranks, runlog, torchrun
from nodekit.launcher.config import EnvError, LaunchConfig, parse_env
from nodekit.launcher.contract import EXIT_BAD_ENV as EXIT_BAD_ENV
from nodekit.launcher.contract import EXIT_OK as EXIT_OK
from nodekit.launcher.contract import EXIT_PEER_LOST as EXIT_PEER_LOST
from nodekit.launcher.contract import EXIT_RENDEZVOUS as EXIT_RENDEZVOUS
from nodekit.launcher.contract import EXIT_STACK_MISMATCH as EXIT_STACK_MISMATCH
from nodekit.launcher.contract import EXIT_TERMINATED as EXIT_TERMINATED
from nodekit.launcher.contract import Env
from nodekit.launcher.plan import (
    Command,
    CommandError,
    Rendezvous,
    Runs,
    exec_plan,
    fallback_run_id,
    local_rank_flag,
    missing_target,
    parse_command,
    start_line,
    style,
)
from nodekit.launcher.preflight import network as netfacts
from nodekit.launcher.preflight.exchange import (
    CONNECT_TIMEOUT_S,
    Clock,
    Outcome,
    PreflightError,
    SecretMismatch,
    linger,
    open_store,
    run_main,
    run_worker,
    wait_reachable,
)
from nodekit.launcher.preflight.stack import gather
from nodekit.launcher.preflight.verdict import Verdict, render
from nodekit.launcher.runlog import err as _err
from nodekit.launcher.stops import (
    SIGNAL_FROM,
    STOP_SIGNALS,
    Stopped,
    on_stop,
    outside_signal,
    signal_name,
)
from nodekit.launcher.watchdog.run import StallConfig, Watchdog, node_names


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _local_rank(cfg: LaunchConfig, command: Command) -> str:
    """The local-rank option the script defines (read from its source only for a style that asks for it)."""
    if not style(cfg.mode).reads_script:
        return "--local-rank"
    path = command.script
    if path is None:
        spec = importlib.util.find_spec(str(command.module))
        path = spec.origin if spec is not None else None
    try:
        return local_rank_flag(Path(path).read_text(errors="replace") if path else None)
    except OSError:
        return local_rank_flag(None)


def _missing_module(command: Command) -> str | None:
    if command.module is None:
        return None
    top = command.module.split(".")[0]
    if importlib.util.find_spec(top) is not None:  # top level only: finding a submodule imports its parents
        return None
    return f"training module {command.module!r}: no package {top!r} in {os.getcwd()} or the image's Python"


def _rendezvous(cfg: LaunchConfig, passed: Passed | None) -> Rendezvous | None:
    """torchrun's c10d rendezvous for a job whose workers may restart (None: static rendezvous, or no torchrun).

    The id is main's, from the verdict (new for every run); this node's address is the one it reached main from."""
    if style(cfg.mode).runs is not Runs.TORCHRUN or cfg.max_restarts == 0:
        return None
    mine = next((f for f in passed.verdict.facts if f.rank == cfg.node_rank), None) if passed else None
    address = cfg.master_addr if cfg.is_main else (mine.address if mine else None)
    run_id = passed.verdict.run_id if passed and passed.verdict.run_id else fallback_run_id(cfg)
    return Rendezvous(run_id=run_id, local_addr=address or netfacts.source_addr(cfg.master_addr))


@dataclass(frozen=True)
class Passed:
    """A good preflight: the store (node 0 hosts it for as long as this object lives; the peer watchdog uses it
    for the whole job) and the verdict, whose facts name every node."""

    store: Any
    verdict: Verdict


def preflight(cfg: LaunchConfig, clock: Clock | None = None) -> tuple[int, Passed | None]:
    """Run the stack check and the who-arrived rendezvous; return ``(0, Passed)`` to go on, else the exit code."""
    clock = clock or Clock()
    # torch warns on import when numpy is absent, which the image need not have; the launcher does not use numpy,
    # and the workers (fresh processes) still show the warning where it matters.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    start = clock.now()
    deadline = start + cfg.rdzv_timeout
    # The store's own timeout bounds each call; the protocol enforces the real deadlines by polling.
    store_timeout = cfg.rdzv_timeout + 60
    outcome: Outcome
    try:
        if cfg.is_main:
            store = open_store(cfg, store_timeout)
            outcome = run_main(store, cfg, gather(cfg, cfg.master_addr), clock)
        else:
            # Facts first: importing torch takes seconds, and main hosts its store before its own import (the
            # store needs no torch), so main is usually there by the time this node looks.
            facts = gather(cfg, "")
            local = wait_reachable(cfg, deadline, clock)
            store = open_store(cfg, store_timeout, connect_s=CONNECT_TIMEOUT_S)
            facts = replace(facts, address=local)
            outcome = run_worker(store, cfg, facts, clock)
    except SecretMismatch as e:
        _err(str(e))
        return EXIT_STACK_MISMATCH, None
    except PreflightError as e:
        _err(str(e))
        return EXIT_RENDEZVOUS, None
    report = render(outcome.verdict)
    elapsed = f"preflight {clock.now() - start:.1f} s"
    took = f"({elapsed})"
    verdict = outcome.verdict
    if verdict.status == "ok" and not outcome.duplicate:
        if outcome.settled_s is not None:
            took = f"({elapsed}, {outcome.settled_s * 1000:.0f} ms once every node was there)"
        print(f"{report} {took}" if "\n" not in report else f"{report}\n{took}", flush=True)
        return EXIT_OK, Passed(store=store, verdict=verdict)
    # The report and the error line go to one stream: Docker collects stdout and stderr separately and would
    # otherwise interleave them in whatever order it read them.
    sys.stdout.flush()
    print(report, file=sys.stderr, flush=True)
    if outcome.duplicate:
        holder = next((f for f in verdict.facts if f.rank == cfg.node_rank), None)
        by = f"{holder.hostname} ({holder.address})" if holder else "another node"
        _err(
            f"node rank {cfg.node_rank} is already taken by {by}; this node does not start. "
            f"Give every node its own --node-rank {took}"
        )
        return EXIT_STACK_MISMATCH, None
    late = " (this node arrived after main had decided)" if outcome.late else ""
    if verdict.status == "mismatch":
        _err(f"stack mismatch between nodes; not starting training{late} {took}")
        if cfg.is_main and verdict.missing:
            _serve_verdict(store, cfg, verdict, clock)
        return EXIT_STACK_MISMATCH, None
    if outcome.late:
        _err(f"this node (rank {cfg.node_rank}) arrived after main stopped waiting; restart every node {took}")
        return EXIT_RENDEZVOUS, None
    _err(f"node(s) {', '.join(map(str, verdict.missing))} never arrived; not starting training {took}")
    return EXIT_RENDEZVOUS, None


def _serve_verdict(store: Any, cfg: LaunchConfig, verdict: Verdict, clock: Clock) -> None:
    """Main after an early refusal: the report is out; keep the verdict readable for the nodes still to come."""
    try:
        linger(store, cfg, verdict, clock)
    except Stopped:
        pass  # `nodekit down` while lingering: the verdict stands, exit with it
    except RuntimeError:
        pass  # the store failed under us: nothing more to serve


def _after_preflight(
    cfg: LaunchConfig, passed: Passed, env: dict[str, str], gpu: checks.GpuCheck
) -> tuple[int | None, checks.LinksBeside | None]:
    """After a passed preflight: every node's GPU health and the link check (checks.py; returned when it runs in a
    thread beside the job's start, where nothing waits for it), the checked mounts compared across nodes (an exit
    code when they differ), and WORLD_SIZE set (in ``env`` and this process's environment) when some node's count
    was 'auto'."""
    # The launcher stays for the whole job (and node 0 hosts the store) under the peer watchdog (plan.Runs.stays);
    # a style that execs its command would end the check.
    stays = cfg.peer_timeout > 0 and style(cfg.mode).runs.stays
    try:
        code, beside = checks.after_preflight(
            cfg, passed.store, passed.verdict.facts, gpu, beside=checks.links_beside_job(cfg, stays)
        )
    except PreflightError as e:
        _err(str(e))
        return EXIT_RENDEZVOUS, None
    if code is not None:
        _err(f"the health checks refused this job; not starting training (exit {code})")
        return code, None
    if cfg.data_check:
        from nodekit.launcher.datacheck import compare as samedata

        same, report = samedata.run(passed.store, cfg.node_rank, cfg.nnodes, cfg.data_check, timeout_s=cfg.rdzv_timeout)
        if not same:
            sys.stdout.flush()
            print(report, file=sys.stderr, flush=True)
            _err("the checked mounts differ between nodes; not starting training")
            return EXIT_STACK_MISMATCH, beside
        print(report, flush=True)
    if cfg.world_size is None:
        # Some node's count was 'auto': now every node has reported it, the world is known.
        world = sum(f.nproc_per_node for f in passed.verdict.facts)
        counts = " + ".join(str(f.nproc_per_node) for f in passed.verdict.facts)
        print(f"nodekit: world {world} ({counts} processes)", flush=True)
        env[Env.WORLD_SIZE] = os.environ[Env.WORLD_SIZE] = str(world)
    return None, beside


def _watchdog(cfg: LaunchConfig, passed: Passed | None, beside: checks.LinksBeside | None = None) -> Watchdog | None:
    """The peer watchdog over the preflight's store, when there was a preflight and NODEKIT_PEER_TIMEOUT > 0; with
    the stall watch when NODEKIT_STALL_TIMEOUT > 0; letting the link check running ``beside`` end before this node
    says it is done."""
    if passed is None or cfg.peer_timeout <= 0:
        return None
    names = node_names(passed.verdict.facts)
    stop = cfg.stall_action == "stop"
    stall = StallConfig(cfg.stall_timeout, stop, cfg.worker_dir) if cfg.stall_timeout > 0 else None
    settle = beside.wait if beside is not None else None
    dog = Watchdog(
        passed.store,
        cfg.node_rank,
        cfg.nnodes,
        cfg.peer_timeout,
        names,
        stop=torchrun.sigterm_self,
        stall=stall,
        settle=settle,
    )
    if beside is not None:
        beside.attach(dog.refuse)
    return dog


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Parse, check, preflight, then exec (never returns on success); returns an exit code otherwise."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    # Per-node network facts (interface toward main) are resolved here, on the node; the workers inherit them.
    resolved = netfacts.resolve(env)
    env |= resolved
    if environ is None:
        os.environ.update(resolved)
    # The job secret is the launcher's alone: the training processes (and whatever they print) never see it.
    os.environ.pop(Env.JOB_SECRET, None)
    try:
        cfg = parse_env(env)
        env.pop(Env.JOB_SECRET, None)
        command = parse_command(argv)
    except (EnvError, CommandError) as e:
        _err(str(e))
        return EXIT_BAD_ENV
    print(start_line(cfg), flush=True)
    problem = missing_target(command, os.getcwd()) or _missing_module(command)
    if problem:
        _err(problem)
        return EXIT_BAD_ENV
    gpu = checks.GpuCheck(cfg, env)  # runs beside the preflight
    passed: Passed | None = None
    if cfg.preflight and cfg.nnodes > 1:
        for s in STOP_SIGNALS:
            signal.signal(s, on_stop)  # stays for in-process torchrun; exec resets it
        try:
            code, passed = preflight(cfg)
        except (Stopped, KeyboardInterrupt) as e:
            signum = outside_signal(e) or int(signal.SIGINT)
            _err(f"stopped by {signal_name(signum)} during preflight ({SIGNAL_FROM}); no worker was started")
            return 128 + signum
        if code != EXIT_OK:
            return code
    beside: checks.LinksBeside | None = None
    if passed is not None:
        stop, beside = _after_preflight(cfg, passed, env, gpu)
        if stop is not None:
            return stop
    if passed is None and (stop := checks.alone(cfg, gpu)) is not None:
        _err(f"the GPU health check refused this node; not starting training (exit {stop})")
        return stop
    if cfg.checks_only:
        print("nodekit: checks done (checks only: nodekit doctor --fleet); no training started", flush=True)
        return EXIT_OK
    runs = style(cfg.mode).runs
    if runs is not Runs.TORCHRUN and cfg.max_restarts > 0:
        print(
            f"nodekit: note: max_restarts = {cfg.max_restarts} does nothing with launcher = {cfg.mode} (no torchrun "
            "restarts the framework's workers); `nodekit run` with restarts = N restarts the whole job",
            flush=True,
        )
    rdzv = _rendezvous(cfg, passed)
    counts = {f.rank: f.nproc_per_node for f in passed.verdict.facts} if passed else None
    plan = exec_plan(
        cfg, command, python=sys.executable, torchrun=torchrun.torchrun_path(), cpus=_cpus(),
        local_rank=_local_rank(cfg, command), rendezvous=rdzv, counts=counts,
    )  # fmt: skip
    if runs is Runs.CHILDREN:  # the launcher starts and watches every process itself
        return ranks.run_watched(plan, env, plan.first_rank, _watchdog(cfg, passed, beside))
    # torchrun runs in this process whenever torch is here: after preflight torch is imported already, and on one
    # node importing it here costs what exec'ing torchrun would, while a signal to the container is then this
    # process's to report as a stop (stops.py). Without torch, exec says what is missing.
    in_process = "torch" in sys.modules or rdzv is not None or importlib.util.find_spec("torch") is not None
    if runs is Runs.TORCHRUN and in_process:
        # torchrun's workers inherit this process's environment.
        os.environ.update(plan.set_env)
        for key, value in plan.default_env:
            os.environ.setdefault(key, value)
        if rdzv is not None:
            torchrun.distinct_node(cfg.node_rank)
        log = runlog.log_path(cfg.output_dir, cfg.node_rank)
        runlog.quiet_exit_barrier(log)
        if (dog := _watchdog(cfg, passed, beside)) is not None:
            return torchrun.watched(plan.argv, dog, cfg.max_restarts, log, cfg.worker_dir)
        passed = None  # no watchdog: node 0 stops hosting the preflight store
        return torchrun.alone(plan.argv, cfg.max_restarts, log)
    # exec replaces the process without flushing Python's buffers: anything unflushed would vanish from the log.
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(plan.argv[0], list(plan.argv), plan.environ(env))
    except OSError as e:
        _err(f"cannot run {plan.argv[0]}: {e.strerror} (the image's Python environment lacks it; `nodekit build`)")
        return EXIT_BAD_ENV
    return EXIT_OK  # not reached: exec does not return
