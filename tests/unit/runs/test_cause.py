"""The exception a node's job raised, read from its output (nodekit/runs/cause.py): the first complete traceback's
last line, with the rank torch's ``[rankN]:`` prefix names; chained exceptions followed to their last link."""

from __future__ import annotations

from nodekit.runs.cause import MAX_QUOTE, Causes

PLAIN = [
    "epoch 1 loss 0.3",
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 9, in <module>',
    "    raise RuntimeError('boom: bad shard 7')",
    "RuntimeError: boom: bad shard 7",
    "nodekit: a worker failed: its own output above says why",
]


def test_a_plain_traceback_is_quoted_without_a_rank() -> None:
    c = Causes()
    for line in PLAIN:
        c.feed(1, line)
    raised = c.first(1)
    assert raised is not None and raised.quote() == "raised RuntimeError: boom: bad shard 7"
    assert c.first(0) is None


def test_the_first_traceback_of_a_node_wins_and_other_nodes_keep_their_own() -> None:
    c = Causes()
    for line in PLAIN:
        c.feed(0, f"[rank3]: {line}")
    for line in ("Traceback (most recent call last):", '  File "x.py", line 1', "OSError: disk full"):
        c.feed(0, f"[rank2]: {line}")
        c.feed(1, line)
    assert c.first(0) is not None and c.first(0).quote() == "rank 3 raised RuntimeError: boom: bad shard 7"  # type: ignore[union-attr]
    assert c.first(1) is not None and c.first(1).text == "OSError: disk full"  # type: ignore[union-attr]


def test_a_chained_exception_is_followed_to_the_one_python_prints_last() -> None:
    c = Causes()
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "KeyError: 'lr'",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "a.py", line 3, in <module>',
        "mypkg.config.ConfigError: no learning rate in config.yaml",
        "done",
    ]
    for line in lines:
        c.feed(0, line)
    assert c.first(0) is not None and c.first(0).text == "mypkg.config.ConfigError: no learning rate in config.yaml"  # type: ignore[union-attr]


def test_colours_and_indented_lines_are_not_exceptions_and_a_long_message_is_cut() -> None:
    c = Causes()
    c.feed(0, "\x1b[31mTraceback (most recent call last):\x1b[0m")
    c.feed(0, '  File "a.py", line 1')
    c.feed(0, "    ValueError: this is source code, not the exception")
    c.feed(0, "ValueError: " + "x" * 1000)
    raised = c.first(0)  # the output ended right after the traceback: still quoted
    assert raised is not None and raised.text.startswith("ValueError: xxx")
    assert len(raised.quote()) <= len("raised ") + MAX_QUOTE and raised.quote().endswith("...")


def test_lines_that_only_look_like_errors_outside_a_traceback_are_ignored() -> None:
    c = Causes()
    for line in ("RuntimeError: printed by the script as a log line", "Warning: low disk", "step 3"):
        c.feed(0, line)
    assert c.first(0) is None


def test_a_node_that_exited_19_is_quoted_by_its_watchdog_s_verdict_of_every_kind() -> None:
    """Each line the peer watchdog prints about another node (from the launcher's own functions) is what the host
    quotes for a node that exited 19; its own gloo traceback is a consequence and is not."""
    from nodekit.launcher.contract import EXIT_PEER_LOST
    from nodekit.launcher.watchdog.decide import Done, Lost, lost_line, stopped_line
    from nodekit.launcher.watchdog.failure import WorkerFailure, node_failed

    names = {0: "10.0.0.5, host a", 2: "10.0.0.7, host c"}
    boom = WorkerFailure(rank=5, local_rank=1, exitcode=1, at=3, max_restarts=0, raised="KeyError: 'x'")
    verdicts = {
        f"nodekit: {node_failed(2, 1, boom, names)}; stopping this node": (
            "node 2 (10.0.0.7, host c) failed: worker rank 5 (local rank 1) raised KeyError: 'x' (exit code 1); "
            "torchrun restarts no worker (max_restarts = 0)"
        ),
        lost_line((Lost(rank=2, silent_s=15.0),), names, "stopping this node"): (
            "node 2 (10.0.0.7, host c) lost: no heartbeat for 15 s"
        ),
        stopped_line(((2, Done(143, signal=15)),), names, "this node exits 19"): (
            "node 2 (10.0.0.7, host c) was stopped by SIGTERM (a signal to its container: nodekit down, docker stop, "
            "docker kill or an administrator)"
        ),
    }
    for line, quoted in verdicts.items():
        c = Causes()
        for own in ("Traceback (most recent call last):", '  File "t.py", line 1', "RuntimeError: Connection reset"):
            c.feed(0, f"[rank0]: {own}")
        c.feed(0, line)
        assert c.quote(0, EXIT_PEER_LOST) == quoted, line
        assert c.quote(0, 1) == "rank 0 raised RuntimeError: Connection reset"
