"""A push's stream when a relay tree is cut: the tree's cleanup on its nodes (ending each node's relay step, which
waits out its deadline on a node that does not answer) must not hold the stream's other targets or the re-feed of the
nodes it cut off. The head's session to the root runs a stand-in; real relays over sshd: tests/cluster/test_tree.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from nodekit.ship import access, relay
from nodekit.ship.fanout_stream import FanOut
from nodekit.ship.hopkeys import Hop
from nodekit.ship.outcome import PushResult, SafeReporter
from nodekit.ship.plan import PushPlan, Source, Step, Target
from nodekit.system.progress import RecordingReporter

CHUNK, CHUNKS = 64 << 10, 1024  # 64 MiB: far more than a pipe and the queues hold


def _hop(name: str) -> Hop:
    return Hop(name=name, endpoint=f"ssh://root@{name}", user="root", hostname=name, port=22, alias=name,
               known_hosts=f"{name} ssh-ed25519 AAAA\n")  # fmt: skip


class _Taken:
    """A direct target's sink that takes everything."""

    def __init__(self) -> None:
        self.bytes, self.finished = 0, False

    def write(self, chunk: bytes) -> None:
        self.bytes += len(chunk)

    def finish(self) -> object:
        self.finished = True
        return None

    def abort(self) -> None:
        raise AssertionError("the direct target was cut off")


def _stream(ref: str, endpoint: str | None) -> Iterator[bytes]:
    for _ in range(CHUNKS):
        yield b"x" * CHUNK


def test_a_cut_tree_whose_nodes_do_not_answer_holds_neither_the_stream_nor_the_push_which_settles_it_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tree's root stops reading (stall deadline 1 s here) and the cleanup on its nodes hangs (a node that does
    not answer): the stream still reaches the direct target whole, the root is named and the node below it cut off
    by it (the push feeds both again), all while the cleanup hangs; :meth:`FanOut.settle` then waits for it."""
    closing, closed = threading.Event(), list[bool]()

    def close(self: access.TreeAccess, kill: bool = False) -> None:
        closing.wait(30)
        closed.append(kill)

    monkeypatch.setattr(access.TreeAccess, "open", lambda self: "the root's relay step")
    monkeypatch.setattr(access.TreeAccess, "close", close)
    monkeypatch.setattr(relay, "node_argv", lambda hop, command, keepalive=False: ["sleep", "600"])
    a, b, c = (Step(target=Target(n, f"ssh://root@{n}"), action="load", reason="missing") for n in "abc")
    plan = PushPlan(source=Source(ref="nodekit/x:1", image_id="sha256:aa", size=CHUNK * CHUNKS, engine_id="e"),
                    steps=(a, b, c))  # fmt: skip
    result, taken = PushResult(plan=plan), _Taken()
    tree = [(a, _hop("a")), (b, _hop("b"))]
    fan = FanOut(plan, [c], "none", frozenset(), SafeReporter(RecordingReporter()), result, None, _stream,
                 lambda endpoint: taken, 1.0, lambda src, step: None, trees=[tree])  # fmt: skip
    run = threading.Thread(target=fan.run, daemon=True)
    run.start()
    run.join(timeout=20)
    try:
        assert not run.is_alive(), "the stream waited for the cut tree's cleanup"
        assert closed == [], "the cleanup ended before the stream did: nothing shows it was not awaited"
        assert taken.finished and taken.bytes == CHUNK * CHUNKS, taken.bytes
        assert result.failures["a"].message.startswith("the relay tree from a took nothing for 1 s"), result.failures
        assert result.cut_by == {"b": "a"}, result.cut_by
    finally:
        closing.set()
    fan.settle()
    assert closed == [True]  # the relay steps on the nodes were ended, and the push waited for that
