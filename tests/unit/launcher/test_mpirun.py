"""launcher = "mpirun": Open MPI's variables laid out as -map-by slot (pure), and the local process group (real
processes: every one started with its variables, the first failure stopping the others, SIGTERM stopping all)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from nodekit.launcher.config import parse_env
from nodekit.launcher.plan import ExecPlan, exec_plan, parse_command, slots
from nodekit.launcher.ranks import run_group
from tests.factories import node_env


def mpi_env(rank: int, **kw: object) -> dict[str, str]:
    return node_env(rank, launcher="mpirun", **kw)


def test_two_nodes_of_two_get_the_ranks_mpirun_map_by_slot_gives() -> None:
    got = []
    for node in (0, 1):
        cfg = parse_env(mpi_env(node, nproc_per_node=2))
        plan = exec_plan(cfg, parse_command(["main.py", "--backend", "gloo"]), python="/venv/bin/python")
        assert plan.argv == ("/venv/bin/python", "main.py", "--backend", "gloo")
        assert "RANK" in plan.unset_env and "LOCAL_RANK" in plan.unset_env
        got += [dict(p) for p in plan.per_process]
    keys = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK")
    assert [tuple(g[k] for k in keys) for g in got] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1"),
    ]  # fmt: skip
    assert {g["OMPI_COMM_WORLD_SIZE"] for g in got} == {"4"} and {g["OMPI_COMM_WORLD_LOCAL_SIZE"] for g in got} == {"2"}


def test_uneven_nodes_follow_the_declared_counts_or_the_preflights() -> None:
    cfg = parse_env(mpi_env(1, nproc_per_node=2, nodes={0: {"nproc_per_node": 3}}))
    assert slots(cfg) == (3, 5)  # node 0's three slots first, then node 1's two
    auto = parse_env(mpi_env(1, nproc_per_node=2, nodes={0: {"nproc_per_node": "auto"}}))
    assert slots(auto, {0: 8, 1: 2}) == (8, 10)  # after a preflight, every node's count is known
    assert slots(auto) == (2, 4)  # without one: this node's count on every node


def script(tmp_path: Path, body: str) -> ExecPlan:
    path = tmp_path / "rank.py"
    path.write_text("import os, sys, time\nr = int(os.environ['OMPI_COMM_WORLD_LOCAL_RANK'])\n" + body)
    cfg = parse_env(mpi_env(0, nproc_per_node=3))
    plan = exec_plan(cfg, parse_command([str(path)]), python=sys.executable)
    return plan


def test_every_process_runs_with_its_variables_and_the_group_succeeds(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    seen = "os.environ['OMPI_COMM_WORLD_RANK'] + ' ' + os.environ['MASTER_ADDR']"
    body = f"open({str(out)!r} + f'/{{r}}', 'w').write({seen})\n"
    plan = script(tmp_path, body)
    code, failure = run_group(plan, {**os.environ, "MASTER_ADDR": "10.0.0.5"}, first_rank=0)
    assert (code, failure) == (0, None)
    assert sorted(p.read_text() for p in out.iterdir()) == ["0 10.0.0.5", "1 10.0.0.5", "2 10.0.0.5"]


def test_the_first_failure_stops_the_others_and_is_the_code(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plan = script(tmp_path, "if r == 1:\n    sys.exit(7)\ntime.sleep(60)\n")
    start = time.monotonic()
    code, failure = run_group(plan, dict(os.environ), first_rank=6)
    assert time.monotonic() - start < 20
    assert code == 7 and failure is not None and (failure.rank, failure.local_rank, failure.exitcode) == (7, 1, 7)
    assert (
        "process rank 7 (local rank 1) exited with code 7; stopping the other 2 process(es)" in capfd.readouterr().err
    )


def test_a_killed_process_is_reported_by_its_signal(tmp_path: Path) -> None:
    plan = script(tmp_path, "if r == 0:\n    os.kill(os.getpid(), 9)\ntime.sleep(60)\n")
    code, failure = run_group(plan, dict(os.environ), first_rank=0)
    assert code == 128 + 9 and failure is not None and failure.exitcode == -9


def test_sigterm_to_the_launcher_stops_every_process(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = script(tmp_path, f"open({str(pids)!r} + f'/{{os.getpid()}}', 'w').close()\ntime.sleep(60)\n")

    def term_when_started() -> None:
        deadline = time.monotonic() + 20
        while len(list(pids.iterdir())) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term_when_started, daemon=True).start()
    code, failure = run_group(plan, dict(os.environ), first_rank=0)
    assert (code, failure) == (143, None)
    for p in pids.iterdir():
        with pytest.raises(ProcessLookupError):
            os.kill(int(p.name), 0)
