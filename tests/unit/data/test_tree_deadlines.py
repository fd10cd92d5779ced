"""A dataset's relay tree is bounded by the deadlines of the sink it feeds (nodekit/ship/relay.py's RelaySink, the
one images use), not by a watch of its own: a root that stops reading is cut after the stall deadline, and a tree
that took the whole stream but never ends after the answer deadline; either way every host is named as missed, for
the re-feed. The head's session to the root runs a stand-in (real relays over sshd: tests/cluster/test_data.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nodekit.data import transport, tree
from nodekit.data.plan import NodeView, plan_host
from nodekit.data.push import Job
from nodekit.data.transport import Where
from nodekit.ship import access, relay
from nodekit.ship.hopkeys import Hop
from nodekit.system.progress import RecordingReporter
from tests.unit.data.stand_ins import Ssh

SIZE = 1 << 20


def _hop(name: str) -> Hop:
    return Hop(name=name, endpoint=f"ssh://root@{name}", user="root", hostname=name, port=22, alias=name,
               known_hosts=f"{name} ssh-ed25519 AAAA\n")  # fmt: skip


def _relay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, root_runs: str,
           closing: threading.Event | None = None) -> tuple[tree.Relayed, RecordingReporter]:  # fmt: skip
    """Two host paths through one tree whose root runs ``root_runs`` (sh) in place of the relay step, within 20 s.
    ``closing``: the cleanup on the nodes hangs until it is set (a node that does not answer)."""
    closed: list[bool] = []

    def close(self: access.TreeAccess, kill: bool = False) -> None:
        if closing is not None:
            closing.wait(30)
        closed.append(kill)

    monkeypatch.setattr(tree, "hop_of", lambda name, endpoint: _hop(name))
    monkeypatch.setattr(access.TreeAccess, "open", lambda self: "the root's relay step")
    monkeypatch.setattr(access.TreeAccess, "close", close)
    monkeypatch.setattr(relay, "node_argv", lambda hop, command, keepalive=False: ["sh", "-c", root_runs])
    (tmp_path / "a.bin").write_bytes(b"a" * SIZE)
    want = {"a.bin": (SIZE, "a" * 64)}
    jobs = [Job(Where(n, Ssh(n)), "/data", tmp_path, "/srv/data") for n in ("n1", "n2")]
    plans = [plan_host(want, NodeView(owned={}, foreign={}), where=j.label) for j in jobs]
    (t,) = tree.plan_trees(jobs, plans, "always")
    reporter = RecordingReporter()
    got: list[tree.Relayed] = []
    run = threading.Thread(target=lambda: got.append(tree.relay(t, jobs, plans, {"a" * 64: tmp_path / "a.bin"},
                                                                 reporter, stall_s=1)), daemon=True)  # fmt: skip
    run.start()
    run.join(timeout=20)
    assert not run.is_alive(), "the relay tree was not cut within 20 s"
    if closing is not None:  # the push went on while the cleanup hangs; settle waits for it
        assert closed == [] and got[0].settle is not None
        closing.set()
    if got[0].settle is not None:
        got[0].settle()
    assert closed and closed[0] is True, closed  # the relay steps on the nodes were ended too
    return got[0], reporter


def test_a_root_that_stops_reading_is_cut_after_the_sinks_stall_deadline_and_every_host_is_missed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    did, reporter = _relay(monkeypatch, tmp_path, "exec sleep 600")
    assert did.fed_by == {} and set(did.missed) == {0, 1}, did
    (warned,) = reporter.said("warn")
    assert warned.startswith("dataset: a relay tree broke (the relay tree from n1 took nothing for 1 s"), warned


def test_a_tree_that_took_the_whole_stream_but_never_ends_is_cut_after_the_answer_deadline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(transport, "SCAN_BASE_S", 1.0)
    did, reporter = _relay(monkeypatch, tmp_path, "cat > /dev/null; exec sleep 600")
    assert did.sent == SIZE and did.fed_by == {} and set(did.missed) == {0, 1}, did
    assert reporter.said("warn") == ["dataset: a relay tree did not finish within 1 s of the stream's end: cut off"]


def test_a_node_that_hangs_its_end_step_does_not_hold_the_push_which_settles_the_cleanup_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The stalled root is likely unreachable: its end step waits out its deadline (30 s), which the hosts it cut off
    need not wait for. The tree returns with the cleanup still running; its settle waits for it."""
    did, _ = _relay(monkeypatch, tmp_path, "exec sleep 600", closing=threading.Event())
    assert set(did.missed) == {0, 1}, did
