"""The health checks around the preflight ([health] in nodekit.toml), carried out for ``main.py``.

- GPU health (``NODEKIT_GPU_HEALTH``, default warn): this node's tools run in a thread from the launcher's start, so
  they overlap the preflight; after a good preflight every node shares its findings and prints every node's, and a
  sick GPU anywhere stops every node with exit 21 when the job says ``gpus = "refuse"``. Without a preflight (one
  node, or NODEKIT_PREFLIGHT=0) the node judges itself alone.
- The link check (``NODEKIT_LINK_CHECK``, default warn; ``linkcheck/``): every pair of nodes measured on the
  training interface after a good preflight; exit 20 for a pair that cannot connect, is below ``min_link_gbit``,
  or (``links = "refuse"``) is far below the others. In warn mode with no ``min_link_gbit`` nothing waits for its
  verdict, so it runs beside the job's start (``LinksBeside``) rather than before it. Skipped when main is a
  loopback address: every node is then on one machine and there is no link to measure.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from collections.abc import Callable, Mapping

from nodekit.launcher.config import LaunchConfig
from nodekit.launcher.contract import EXIT_GPU, EXIT_LINK
from nodekit.launcher.gpuhealth import gather as gpus
from nodekit.launcher.gpuhealth.judge import NodeHealth, render
from nodekit.launcher.linkcheck import run as links
from nodekit.launcher.linkcheck.rounds import estimate_s
from nodekit.launcher.linkcheck.verdict import LinkVerdict, Mode
from nodekit.launcher.linkcheck.verdict import render as render_links
from nodekit.launcher.preflight import network as netfacts
from nodekit.launcher.preflight.exchange import Store
from nodekit.launcher.preflight.stack import StackReport

# The GPU tools' own deadlines bound them; this only keeps a wedged driver call from holding the job forever.
GPU_WAIT_S = gpus.SMI_TIMEOUT_S + gpus.DMESG_TIMEOUT_S + gpus.DIAG_TIMEOUT_S + 10


def _say(text: str, problem: bool) -> None:
    if not text:
        return
    sys.stdout.flush()
    print(text, file=sys.stderr if problem else sys.stdout, flush=True)


class GpuCheck:
    """This node's GPU tools, running in a daemon thread from construction (nothing when gpus = "off")."""

    def __init__(self, cfg: LaunchConfig, env: Mapping[str, str], host: str | None = None) -> None:
        self.cfg = cfg
        self._result: NodeHealth | None = None
        self._thread: threading.Thread | None = None
        if cfg.gpu_health == "off":
            return
        expected = gpus.expected_gpus(cfg.node_rank, cfg.gpus_declared, env)
        name = host or socket.gethostname()

        def work() -> None:
            self._result = gpus.check_node(cfg.node_rank, name, expected=expected, dcgm=cfg.dcgm)

        self._thread = threading.Thread(target=work, name="nodekit-gpu-health", daemon=True)
        self._thread.start()

    def result(self) -> NodeHealth | None:
        if self._thread is None:
            return None
        self._thread.join(GPU_WAIT_S)
        if self._result is None:
            return NodeHealth(self.cfg.node_rank, socket.gethostname(), 0, ("GPU tools did not finish",))
        return self._result


def _gpu_code(cfg: LaunchConfig, nodes: list[NodeHealth]) -> int | None:
    refuse = cfg.gpu_health == "refuse"
    sick = any(n.sick for n in nodes)
    _say(render(nodes, refuse=refuse), sick)
    return EXIT_GPU if sick and refuse else None


def alone(cfg: LaunchConfig, check: GpuCheck) -> int | None:
    """No preflight: this node's GPU findings only. An exit code to stop with, or None to go on."""
    mine = check.result()
    return None if mine is None else _gpu_code(cfg, [mine])


def link_job(cfg: LaunchConfig, facts: StackReport) -> links.LinkJob:
    """This node's part of the link check. It is reached at the address it reached main from (main: MASTER_ADDR),
    on the pinned interface's address when the job pins one; it listens and sends from that address when it is
    this machine's own, else (main behind an address translation) from any address."""
    addr = cfg.master_addr if cfg.is_main else facts.address
    if cfg.iface:
        addr = netfacts.iface_addr(cfg.iface) or addr
    held = netfacts.iface_holding(addr)
    iface = cfg.iface or held or ""
    mode: Mode = "refuse" if cfg.link_check == "refuse" else "warn"
    return links.LinkJob(
        rank=cfg.node_rank, nnodes=cfg.nnodes, host=facts.hostname, addr=addr, iface=iface, secret=cfg.job_secret,
        mode=mode, min_gbit=cfg.min_link_gbit, seconds=cfg.link_seconds, bind=None if held or ":" in addr else "",
    )  # fmt: skip


def links_beside_job(cfg: LaunchConfig, launcher_stays: bool) -> bool:
    """Whether the link check runs beside the job's start instead of before it: only when nothing waits for its
    verdict (``links = "warn"`` with no ``min_link_gbit``: it can only print) and not for ``nodekit doctor --fleet``
    (the verdict is the point), and only while this launcher stays to host or use the store for the whole job
    (``launcher_stays``: torchrun in this process or mpirun's processes, under the peer watchdog). Every node decides
    the same, from the same settings."""
    return launcher_stays and cfg.link_check == "warn" and cfg.min_link_gbit is None and not cfg.checks_only


class LinksBeside:
    """The link check in a thread beside the job's start: torchrun's rendezvous and its workers' start (an import
    of torch, seconds) overlap the check's rounds (0.5 s at 2 nodes, 1.5 s at 4, 3.5 s at 8) instead of following
    them. Its verdict is printed when it is known, as before. A refusal (in warn mode: a pair that cannot connect,
    which the job's own connections would not survive either) goes to the peer watchdog (:meth:`attach`), which
    stops this node's job: every node reads the same verdict and exits 20. A check the job outlived (the store gone)
    says so in one line."""

    def __init__(self, cfg: LaunchConfig, store: Store, me: StackReport) -> None:
        self.verdict: LinkVerdict | None = None
        self._lock = threading.Lock()
        self._refuse: Callable[[str], None] | None = None
        self._refused: str | None = None
        job = link_job(cfg, me)
        self._bound_s = 2 * estimate_s(cfg.nnodes, job.seconds) + 20.0

        def work() -> None:
            try:
                self.verdict = verdict = _check_links(cfg, store, job, started=True)
            except Exception as e:  # a thread's failure: one line, never a traceback in the job's log
                _say(f'nodekit link check: not finished: {e} (links = "warn": the job goes on)', True)
                return
            if verdict.refused:  # a pair that cannot connect: the job cannot run either; stop it, exit 20
                line = f"nodekit: the link check refused this job; stopping this node (exit {EXIT_LINK})"
                with self._lock:
                    self._refused, refuse = line, self._refuse
                if refuse is not None:
                    refuse(line)

        print('nodekit link check: running beside the job\'s start (links = "warn": nothing waits for it)', flush=True)
        self._thread = threading.Thread(target=work, name="nodekit-link-check", daemon=True)
        self._thread.start()

    def attach(self, refuse: Callable[[str], None]) -> None:
        """Where a refusal goes: the peer watchdog's :meth:`Watchdog.refuse`, which stops this node's job."""
        with self._lock:
            self._refuse, line = refuse, self._refused
        if line is not None:
            refuse(line)

    def wait(self) -> None:
        """Let the check end before this node says it is done (the store goes when the job does); bounded."""
        self._thread.join(self._bound_s)


def _check_links(cfg: LaunchConfig, store: Store, job: links.LinkJob, *, started: bool) -> LinkVerdict:
    """This node's part of the link check, its report printed (``started``: beside the job's start)."""
    verdict = links.run(store, job, getattr(store, "run_id", b""))
    # The matrix once, on main: every node printing it made 45 lines for 3 nodes; the findings each node prints.
    _say(render_links(verdict, matrix=cfg.is_main, started=started), verdict.refused)
    return verdict


def after_preflight(
    cfg: LaunchConfig, store: Store, facts: tuple[StackReport, ...], check: GpuCheck, *, beside: bool = False
) -> tuple[int | None, LinksBeside | None]:
    """Every node together, after a good preflight: the GPU health of every node, then the link check (started in a
    thread when ``beside``: see :func:`links_beside_job`). An exit code to stop with (the same on every node) or
    None to go on, and the link check running beside the job, if any. A lost store raises PreflightError."""
    mine = check.result()
    if mine is not None:
        code = _gpu_code(cfg, gpus.share(store, mine, cfg.nnodes, cfg.rdzv_timeout))
        if code is not None:
            return code, None
    if cfg.link_check == "off" or cfg.nnodes < 2:
        return None, None
    if ipaddress.ip_address(cfg.master_addr).is_loopback:
        print(f"nodekit link check: skipped (main {cfg.master_addr}: every node is on this machine)", flush=True)
        return None, None
    me = next(f for f in facts if f.rank == cfg.node_rank)
    if beside:
        return None, LinksBeside(cfg, store, me)
    verdict = _check_links(cfg, store, link_job(cfg, me), started=False)
    return (EXIT_LINK if verdict.refused else None), None
