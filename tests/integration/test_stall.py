"""A job that stops progressing, on a real engine: two nodes of examples/ddp's stall.py on this machine (main
127.0.0.1), the stall watch at 10 s. One job serves every check: 15 s of silent DDP training and 15 s of rank 0
computing alone while rank 1 waits in a barrier (each longer than the stall timeout, and neither stopped), with
``nodekit stacks`` showing both ranks meanwhile; then the two ranks issue different collectives (the deadlock of
nodes that resumed from different epochs), ``nodekit stacks`` names both places, and the watch ends both nodes with
exit 22 within the stall timeout + 10 s, naming rank 0's and rank 1's places.

``NODEKIT_STACKS_CAPTURE=<dir>`` also writes what each node's reader printed (tests/unit/launcher/fixtures holds
such captures: the grouping is tested on them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from nodekit.backends.compose.node import project_for
from nodekit.backends.compose.stacks import READER
from nodekit.config.settings import load
from nodekit.launcher.contract import EXIT_STALLED
from tests.integration.conftest import nodekit

pytestmark = pytest.mark.docker
STALL_S = 10
PORT = 29790
HANG = "issuing a different collective than the other ranks"


def container(project: str) -> str:
    ids = subprocess.run(["docker", "compose", "-p", project, "ps", "-aq"], capture_output=True, text=True,
                         timeout=60).stdout.split()  # fmt: skip
    assert ids, f"{project} has no container"
    return ids[0]


def log(project: str) -> str:
    """The node's output with Docker's timestamps, stdout and stderr together."""
    return subprocess.run(["docker", "logs", "--timestamps", container(project)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60).stdout  # fmt: skip


def wait_for(projects: list[str], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(text in log(p) for p in projects):
        assert time.monotonic() < deadline, f"no {text!r} on every node within {timeout:.0f} s:\n" + "\n".join(
            log(p)[-3000:] for p in projects
        )
        time.sleep(0.3)


def stamp(text: str) -> float:
    """Docker's RFC 3339 timestamp (nanoseconds) as seconds since the epoch."""
    whole, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{frac or 0}")


def capture(projects: list[str], name: str) -> None:
    where = os.environ.get("NODEKIT_STACKS_CAPTURE")
    if not where:
        return
    for rank, p in enumerate(projects):
        out = subprocess.run(["docker", "exec", container(p), *READER], capture_output=True, text=True, timeout=60)
        Path(where, f"{name}-node{rank}.json").write_text(out.stdout)


def test_a_mismatched_collective_is_named_and_stopped_while_quiet_progress_is_not(
    ddp_project: Path, record_property: pytest.RecordProperty
) -> None:
    config = ddp_project / "nodekit.toml"
    projects = [project_for(load(config), r) for r in (0, 1)]
    env = {
        "NODEKIT_STALL_TIMEOUT": str(STALL_S),
        "NODEKIT_ARGS": json.dumps(["--quiet", "15", "--solo", "15", "--mismatch"]),
    }
    flags = ["--main", "127.0.0.1", "--master-port", str(PORT), "--script", "stall.py", "--detach"]
    try:
        for rank in (1, 0):
            up = nodekit("up", "--node-rank", str(rank), *flags, config=config, env=env)
            assert up.returncode == 0, up.stdout + up.stderr
        wait_for(projects, "stall-demo: training quietly", 180)
        time.sleep(2)
        healthy = nodekit("stacks", "--all", config=config)
        capture(projects, "training")
        wait_for(projects, HANG, 120)
        time.sleep(1)
        hung = nodekit("stacks", config=config)
        capture(projects, "mismatch")
        ended = [
            subprocess.run(["docker", "wait", container(p)], capture_output=True, text=True, timeout=120)
            for p in projects
        ]
        logs = [log(p) for p in projects]
        finished = [
            subprocess.run(["docker", "inspect", "--format", "{{.State.FinishedAt}}", container(p)],
                           capture_output=True, text=True, timeout=60).stdout.strip()
            for p in projects
        ]  # fmt: skip
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
    shown = "\n".join(f"--- node {r}\n{logs[r][-4000:]}" for r in (0, 1))
    # While it trained, nodekit stacks showed both ranks' stacks, one per node.
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "2 rank(s) on 2 node(s)" in healthy.stdout and "rank 0 (node 0, pid" in healthy.stdout, healthy.stdout
    assert "rank 1 (node 1, pid" in healthy.stdout, healthy.stdout
    # In the deadlock, it named both places.
    assert hung.returncode == 0, hung.stdout + hung.stderr
    assert re.search(r"rank 0 in all_reduce at stall\.py:\d+", hung.stdout), hung.stdout
    assert re.search(r"rank 1 in all_gather at stall\.py:\d+", hung.stdout), hung.stdout
    # The quiet phases were never taken for a stall; the deadlock was, on both nodes, with their own exit code.
    codes = [int(e.stdout.strip() or -1) for e in ended]
    assert codes == [EXIT_STALLED, EXIT_STALLED], f"exit codes {codes}\n{shown}"
    for r in (0, 1):
        before = logs[r].split(HANG, 1)[0]
        assert "solo phase done" in before and "no rank made progress" not in before, shown
    report = logs[0].split("nodekit: the job stalled", 1)[-1]
    assert re.search(r"rank 0 in all_reduce at stall\.py:\d+", report), shown
    assert re.search(r"rank 1 in all_gather at stall\.py:\d+", report), shown
    line = next(ln for ln in logs[1].splitlines() if "no rank made progress for" in ln)
    assert re.search(r"rank 0 in all_reduce at stall\.py:\d+; rank 1 in all_gather at stall\.py:\d+;", line), line
    assert f"stopping this node (exit {EXIT_STALLED})" in line, line
    # Within the stall timeout + 10 s of the last rank's mismatched collective, both nodes had ended.
    hung_at = max(stamp(next(ln for ln in logs[r].splitlines() if HANG in ln).split()[0]) for r in (0, 1))
    took = max(stamp(f) for f in finished) - hung_at
    record_property("mismatch_to_both_nodes_ended_s", round(took, 1))
    print(f"mismatched collectives to both nodes ended: {took:.1f} s (stall_timeout {STALL_S} s)")
    assert took <= STALL_S + 10, f"{took:.1f} s\n{shown}"
