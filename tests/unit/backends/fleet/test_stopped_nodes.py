"""The head of a fleet names a node a signal from outside stopped as stopped, not as failed (issue 28)."""

from __future__ import annotations

from nodekit.backends.fleet.supervise import ended_how


def test_the_head_says_a_node_was_stopped_not_that_it_failed() -> None:
    assert ended_how(129) == "was stopped by SIGHUP (exit 129)" and ended_how(130) == "was stopped by SIGINT (exit 130)"
    assert ended_how(143) == "was stopped by SIGTERM (exit 143)"
    assert ended_how(1) == "failed with exit code 1" and ended_how(137) == "failed with exit code 137"
