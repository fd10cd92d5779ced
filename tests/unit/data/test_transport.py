"""The one conversation with a node's receiver that the dataset push, the gather and the restart hand-off share
(:func:`nodekit.data.transport.talk`), with real child processes: whatever ends it (a node that stops reading, a
node that never exits, Ctrl-C in the middle of the stream), no child outlives it, and every wait has a deadline."""

from __future__ import annotations

import sys
import time

import pytest

from nodekit.data.transport import talk
from nodekit.errors import DeadlineError
from nodekit.system import proc


def child(code: str) -> proc.Child:
    return proc.start([sys.executable, "-c", code], deadline=proc.Stall(30), what="a test receiver", fix="",
                      stdin="pipe", stdout="pipe", stderr="pipe", group=True)  # fmt: skip


def test_a_node_that_stops_reading_is_heard_out_its_code_output_and_errors() -> None:
    c = child("import sys; sys.stdout.write('{}'); sys.stderr.write('nodekit-data: refused: no'); sys.exit(3)")
    assert c.stdin is not None

    def feed() -> None:
        assert c.stdin is not None
        time.sleep(0.5)  # it has exited: the writes meet a broken pipe
        for _ in range(200):
            c.stdin.write(b"x" * 65536)
        c.stdin.close()

    code, out, err = talk(c, feed, 30, late="the test receiver did not finish", fix="")
    assert (code, out, err) == (3, b"{}", b"nodekit-data: refused: no")


def test_a_node_that_never_exits_after_its_stream_is_stopped_at_the_deadline() -> None:
    c = child("import sys, time; sys.stdin.read(); time.sleep(60)")

    def feed() -> None:
        assert c.stdin is not None
        c.stdin.write(b"all of it")
        c.stdin.close()

    t0 = time.monotonic()
    with pytest.raises(DeadlineError, match=r"^the test receiver did not finish within 1 s of the stream's end"):
        talk(c, feed, 1, late="the test receiver did not finish", fix="")
    assert time.monotonic() - t0 < 20
    assert c.poll() is not None  # killed and reaped, not left running


def test_ctrl_c_in_the_middle_of_the_stream_kills_the_node() -> None:
    c = child("import sys, time; sys.stdin.read(); time.sleep(60)")

    def feed() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        talk(c, feed, 30, late="the test receiver did not finish", fix="")
    assert c.poll() is not None


def test_every_host_is_heard_from_and_the_first_failure_counts_the_others() -> None:
    """``at_once`` (push, gather and the restart hand-off): a host that fails does not stop the others; its
    NodekitError stands in its place; ``raise_first`` raises the first and says how many others failed."""
    from nodekit.data.transport import at_once, raise_first
    from nodekit.errors import UsageError

    seen: list[int] = []

    def one(i: int) -> int:
        seen.append(i)
        if i % 2:
            raise UsageError(f"host {i} refused", fix="")
        return i * 10

    results = at_once(one, [0, 1, 2, 3, 4])
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert [r if isinstance(r, int) else str(r.message) for r in results] == [0, "host 1 refused", 20,
                                                                               "host 3 refused", 40]  # fmt: skip
    with pytest.raises(UsageError) as e:
        raise_first(results, "node(s)")
    assert e.value.message == "host 1 refused (and 1 other node(s) failed)"
    raise_first(at_once(lambda i: i, [1, 2]), "node(s)")  # nothing failed: nothing raised
