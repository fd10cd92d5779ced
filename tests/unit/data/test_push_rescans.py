"""The scans after a relay tree (nodekit.data.push.answered_soon): a host still silent a grace after the others
answered does not hold back the second tree for the hosts it cut off; it is handed on, its scan still running."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from nodekit.data.push import answered_soon
from nodekit.data.transport import DataError


def test_every_scan_that_answers_is_used_and_a_failed_one_is_its_error() -> None:
    def scan(i: int) -> int:
        if i == 2:
            raise DataError("node 2: ssh: connect to host: Connection refused")
        return i * 10

    with ThreadPoolExecutor(4) as pool:
        answers, late = answered_soon(pool, scan, [0, 1, 2], grace_s=5)
    assert late == {}
    assert answers[0] == 0 and answers[1] == 10
    assert isinstance(answers[2], DataError) and "Connection refused" in answers[2].message


def test_a_silent_host_is_handed_on_after_the_grace_with_its_scan_still_running() -> None:
    release = threading.Event()

    def scan(i: int) -> int:
        if i == 1:
            release.wait(30)  # SSH waiting out its keepalive on a host whose link is gone
        return i

    with ThreadPoolExecutor(4) as pool:
        start = time.monotonic()
        answers, late = answered_soon(pool, scan, [0, 1, 2], grace_s=0.3)
        waited = time.monotonic() - start
        assert set(answers) == {0, 2} and set(late) == {1}
        assert waited < 10, waited  # not the 30 s of the silent one
        assert not late[1].done()
        release.set()
        assert late[1].result(timeout=10) == 1


def test_when_no_scan_has_answered_every_one_is_waited_for() -> None:
    def scan(i: int) -> int:
        time.sleep(0.6 + 0.1 * i)  # all slower than the grace, none answered before it
        return i

    with ThreadPoolExecutor(4) as pool:
        answers, late = answered_soon(pool, scan, [0, 1], grace_s=0.1)
    # The first answered at 0.6 s: the second is given twice that, so it is not late.
    assert late == {} and answers == {0: 0, 1: 1}


def test_a_bug_in_a_scan_is_raised_not_taken_for_a_host_failure() -> None:
    def scan(i: int) -> int:
        raise KeyError(i)

    with ThreadPoolExecutor(2) as pool, pytest.raises(KeyError):
        answered_soon(pool, scan, [0], grace_s=0.1)
