"""Run the GPU tools on this node and share every node's findings through the preflight store.

``nvidia-smi -q`` takes well under a second; the kernel log is read with ``dmesg`` where the container may (it
usually may not: Docker drops CAP_SYSLOG, and ``nodekit doctor`` on the host reads it instead); ``dcgmi diag -r 1``
runs where DCGM is installed in the image and reaches a host engine (``[health] dcgm``), and takes seconds.
Every tool has a deadline; one that is missing or fails is said in the report's ``checked`` list, never fatal.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping

from nodekit.launcher.gpuhealth.judge import NodeHealth, judge
from nodekit.launcher.gpuhealth.parse import parse_dcgmi_diag, parse_smi_q, parse_xids
from nodekit.launcher.preflight.exchange import POLL_S, Clock, PreflightError, Store, _key

SMI_TIMEOUT_S = 30.0
DMESG_TIMEOUT_S = 5.0
DIAG_TIMEOUT_S = 180.0
DIAG_LEVEL = 1
SEEN_WAIT_S = 15.0

Runner = Callable[[list[str], float], tuple[int, str] | None]


def run_tool(argv: list[str], timeout: float) -> tuple[int, str] | None:
    """``(exit code, stdout + stderr)``, or None when the tool is not installed or did not finish in time."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.returncode, done.stdout + done.stderr


def expected_gpus(rank: int, declared: tuple[tuple[int, int], ...], env: Mapping[str, str]) -> tuple[int, str] | None:
    """The GPU count this node should show: its ``[nodes.R] gpus``, else what Slurm allocated to the step."""
    mine = dict(declared).get(rank)
    if mine is not None:
        return mine, f"declared ([nodes.{rank}] gpus)"
    slurm = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if slurm.isdigit():
        return int(slurm), "allocated by Slurm (SLURM_GPUS_ON_NODE)"
    return None


def check_node(
    rank: int,
    host: str,
    *,
    expected: tuple[int, str] | None,
    dcgm: bool,
    run: Runner = run_tool,
) -> NodeHealth:
    """Run the tools here and judge what they said."""
    checked: list[str] = []
    got = run(["nvidia-smi", "-q"], SMI_TIMEOUT_S)
    if got is None:
        return judge(rank, host, None, expected=expected, checked=["no nvidia-smi"])
    smi = parse_smi_q(got[1])
    checked.append("nvidia-smi -q")
    if not smi.gpus and not smi.unreachable:
        return judge(rank, host, smi, expected=expected, checked=checked)
    log = run(["dmesg"], DMESG_TIMEOUT_S)
    xids = parse_xids(log[1]) if log is not None and log[0] == 0 else []
    checked.append("kernel log" if log is not None and log[0] == 0 else "kernel log unreadable here")
    rows = []
    if dcgm:
        diag = run(["dcgmi", "diag", "-r", str(DIAG_LEVEL)], DIAG_TIMEOUT_S)
        if diag is not None:
            rows = parse_dcgmi_diag(diag[1])
            checked.append(f"dcgmi diag -r {DIAG_LEVEL}" if rows else "dcgmi diag gave no table")
    return judge(rank, host, smi, xids=xids, diag=rows, diag_level=DIAG_LEVEL, expected=expected, checked=checked)


def share(
    store: Store, mine: NodeHealth, nnodes: int, timeout_s: float, clock: Clock | None = None
) -> list[NodeHealth]:
    """Publish this node's findings, read every node's (the same list on every node). Main keeps the store up
    until every node has read them (bounded), since a refusal ends its process next."""
    clock = clock or Clock()
    try:
        store.set(_key("health", mine.rank), mine.to_json())
        keys = [_key("health", r) for r in range(nnodes)]
        deadline = clock.now() + timeout_s
        while not store.check(keys):
            if clock.now() >= deadline:
                missing = [r for r in range(nnodes) if not store.check([_key("health", r)])]
                raise PreflightError(f"node(s) {', '.join(map(str, missing))} sent no GPU health report")
            clock.sleep(POLL_S)
        nodes = [NodeHealth.from_json(store.get(k)) for k in keys]
        store.set(_key("health-seen", mine.rank), "1")
        if mine.rank == 0:
            seen = [_key("health-seen", r) for r in range(1, nnodes)]
            until = clock.now() + SEEN_WAIT_S
            while not store.check(seen) and clock.now() < until:
                clock.sleep(POLL_S)
        return nodes
    except RuntimeError as e:  # StoreError: main went away
        raise PreflightError(f"lost main's store during the GPU health check: {e}") from e
