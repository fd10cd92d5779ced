"""The preflight protocol against an in-memory store (threads stand in for nodes), reachability against real
loopback sockets, and the launcher's early exits. The store itself (nodekit's, on a real port) is tested in
tests/unit/launcher/store/test_store.py and tests/unit/job/test_secret.py; here it is an in-memory one."""

from __future__ import annotations

import errno
import socket
import threading
import time
from pathlib import Path

import pytest

from nodekit.launcher.main import EXIT_BAD_ENV, main
from nodekit.launcher.preflight.exchange import (
    Clock,
    Outcome,
    PreflightError,
    linger,
    probe,
    run_main,
    run_worker,
    wait_reachable,
)
from nodekit.launcher.preflight.verdict import render
from tests.factories import LAUNCH_ENV, MemStore, cfg, facts, quiet, run_nodes


def test_identical_nodes_all_get_the_same_ok_verdict_and_confirm_it() -> None:
    store = MemStore()
    out = run_nodes(store, [(cfg(r, 3), facts(r)) for r in range(3)])
    assert [o.verdict.status for o in out] == ["ok", "ok", "ok"]
    assert out[0].verdict == out[1].verdict == out[2].verdict
    assert store.check(["nodekit/seen/1", "nodekit/seen/2"])
    # Main's own cost is measured from the last arrival; only main knows it.
    assert out[0].settled_s is not None and 0 <= out[0].settled_s < 5
    assert out[1].settled_s is None and out[2].settled_s is None


def test_no_own_cost_is_claimed_when_a_node_never_came() -> None:
    (main,) = run_nodes(MemStore(), [(cfg(0, 2, timeout=0.3), facts(0))])
    assert main.verdict.status != "ok" and main.settled_s is None


def test_a_different_stack_stops_every_node_with_the_same_verdict() -> None:
    out = run_nodes(MemStore(), [(cfg(0), facts(0)), (cfg(1), facts(1, torch="2.12.0"))])
    assert [o.verdict.status for o in out] == ["mismatch", "mismatch"]
    assert out[0].verdict == out[1].verdict
    assert [d.field for d in out[0].verdict.errors] == ["torch"]


def test_a_node_that_never_comes_is_named_after_the_timeout() -> None:
    started = time.monotonic()
    out = run_nodes(MemStore(), [(cfg(0, 3, 0.5), facts(0)), (cfg(1, 3, 0.5), facts(1))])
    assert time.monotonic() - started < 5
    assert [o.verdict.status for o in out] == ["missing", "missing"]
    assert out[1].verdict.missing == (2,) and out[1].verdict.arrived == (0, 1)


def test_a_rank_claimed_twice_is_a_mismatch_and_the_second_claimant_knows() -> None:
    store = MemStore()
    worker_results: list[Outcome] = []
    workers = [
        threading.Thread(target=lambda f=f: worker_results.append(run_worker(store, cfg(1), f, quiet())))
        for f in (facts(1), facts(1, hostname="host-dup"))
    ]
    for t in workers:
        t.start()
    while not store.check(["nodekit/dup/1/2"]):
        time.sleep(0.01)
    main_outcome = run_main(store, cfg(0), facts(0), quiet())
    for t in workers:
        t.join(timeout=10)
    assert main_outcome.verdict.status == "mismatch"
    assert [f.hostname for f in main_outcome.verdict.duplicates] == ["host-dup"]
    assert sorted(o.duplicate for o in worker_results) == [False, True]


def test_a_node_arriving_after_the_verdict_knows_it_is_late() -> None:
    store = MemStore()
    run_main(store, cfg(0, 2, 0.2), facts(0), quiet())
    late = run_worker(store, cfg(1, 2, 0.2), facts(1), quiet())
    assert late.late and late.verdict.status == "missing"


def test_losing_main_mid_protocol_is_one_line() -> None:
    store = MemStore()
    store.broken = True
    with pytest.raises(
        PreflightError, match=r"^lost main 10\.0\.0\.5:29501 during preflight: Connection reset by peer$"
    ):
        run_worker(store, cfg(1), facts(1), quiet())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_probe_tells_a_closed_port_from_an_open_one() -> None:
    port = closed_port()
    assert probe("127.0.0.1", port, 1.0) == ("connection refused", None)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        reason, local = probe("127.0.0.1", server.getsockname()[1], 1.0)
    assert reason is None and local == "127.0.0.1"


def test_a_worker_that_cannot_reach_main_says_so_within_the_timeout() -> None:
    c = cfg(1, 2, 0.6, MASTER_ADDR="127.0.0.1", NODEKIT_PREFLIGHT_PORT=str(closed_port()))
    started = time.monotonic()
    with pytest.raises(PreflightError) as info:
        wait_reachable(c, time.monotonic() + c.rdzv_timeout, quiet())
    assert time.monotonic() - started < 3
    assert str(info.value).startswith(f"cannot reach main 127.0.0.1:{c.preflight_port} (connection refused)")


def test_bad_environment_and_missing_script_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["train.py"], {k: v for k, v in LAUNCH_ENV.items() if k != "NNODES"}) == EXIT_BAD_ENV
    assert capsys.readouterr().err.strip().startswith("nodekit: error: NNODES is not set")
    assert main(["train.py"], LAUNCH_ENV) == EXIT_BAD_ENV
    out, err = capsys.readouterr()
    assert out.startswith("nodekit ddp-demo: node 1/2 |") and "'train.py' not found in" in err
    assert main(["-m", "no_such_pkg_nodekit.train"], LAUNCH_ENV) == EXIT_BAD_ENV
    assert "no package 'no_such_pkg_nodekit'" in capsys.readouterr().err


def test_a_mismatch_among_the_nodes_already_here_does_not_wait_for_the_rest() -> None:
    started = time.monotonic()
    out = run_nodes(MemStore(), [(cfg(0, 3, 30.0), facts(0)), (cfg(1, 3, 30.0), facts(1, cuda="12.4"))])
    assert time.monotonic() - started < 5
    verdict = out[0].verdict
    assert verdict.status == "mismatch" and verdict.stopped_early and verdict.missing == (2,)
    assert out[1].verdict == verdict
    assert "  2     (not yet arrived)" in render(verdict)
    assert "2 of 3 nodes had arrived when the mismatch above stopped the wait" in render(verdict)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (TimeoutError("timed out"), "timed out"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "network unreachable"),
        (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "Cannot assign requested address"),
    ],
)
def test_probe_names_why_main_is_unreachable(monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str) -> None:
    def fail(*args: object, **kwargs: object) -> socket.socket:
        raise error

    monkeypatch.setattr(socket, "create_connection", fail)
    assert probe("10.0.0.5", 29501, 0.1) == (reason, None)


def test_a_node_arriving_after_an_early_mismatch_gets_the_verdict_not_an_absent_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node 0 decides early (node 2 differs): it reports at once and keeps serving, so node 1, arriving later,
    still finds the store and reads the verdict instead of retrying until its own rdzv_timeout."""
    import nodekit.launcher.main as launcher_main

    store = MemStore()
    node_facts = {0: facts(0), 1: facts(1), 2: facts(2, torch="2.12.0")}
    monkeypatch.setattr(launcher_main, "open_store", lambda c, *a, **k: store)
    monkeypatch.setattr(launcher_main, "gather", lambda c, addr: node_facts[c.node_rank])
    monkeypatch.setattr(launcher_main, "wait_reachable", lambda c, deadline, clock: f"10.0.0.{5 + c.node_rank}")
    codes: dict[int, int] = {}
    ended: dict[int, float] = {}

    def node(rank: int) -> None:
        codes[rank], _ = launcher_main.preflight(cfg(rank, 3, 60.0), quiet())
        ended[rank] = time.monotonic()

    started = time.monotonic()
    main_thread = threading.Thread(target=node, args=(0,))
    main_thread.start()
    node(2)
    while not store.check(["nodekit/verdict"]):
        time.sleep(0.01)
    reported = time.monotonic() - started
    time.sleep(0.5)  # node 1 is late: main has reported, and must still be there
    assert main_thread.is_alive(), "main left before every node had read the verdict"
    node(1)
    main_thread.join(timeout=10)
    assert not main_thread.is_alive()
    assert codes == {0: 17, 1: 17, 2: 17}
    assert reported < 5
    assert ended[0] - ended[1] < 2, "main keeps serving only until the last node has read the verdict"
    err = capsys.readouterr().err
    assert "this node arrived after main had decided" in err


def test_main_lingers_after_a_refusal_no_longer_than_its_window() -> None:
    store = MemStore()
    now = [0.0]
    lines: list[str] = []

    def sleep(s: float) -> None:
        now[0] += s

    clock = Clock(now=lambda: now[0], sleep=sleep, log=lines.append)
    store.add("nodekit/seen/1", 1)
    verdict = run_nodes(MemStore(), [(cfg(0, 2), facts(0)), (cfg(1, 2), facts(1, torch="2.12.0"))])[0].verdict
    assert linger(store, cfg(0, 3, 600.0), verdict, clock) == (2,)
    assert 30.0 <= now[0] < 30.5
    assert lines == ["nodekit preflight: node(s) 2 never read the verdict within 30 s; main ends the job"]
    now[0] = 0.0
    assert linger(store, cfg(0, 3, 8.0), verdict, clock) == (2,) and now[0] < 8.5
