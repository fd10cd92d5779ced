"""The sampled link check with real sockets: 24 nodes (above ALL_PAIRS_MAX), each a thread with its own loopback
address (127.0.0.x), its own listener and its own connection to a real preflight store, the real probes and
handshakes. One node's link is slow: every send on a connection with its address is paced, in the test's own
shaper (the loopback's stand-in for ``tc`` on that node's interface, both directions). The plan measures a sample
of the pairs, re-tests the suspects against known-good nodes, and names the slow node. The nodes' listeners and
transfers run in this process (``apart.Here``), where the shaper is, not each in a process of its own."""

from __future__ import annotations

import socket
import threading
from collections import Counter

import pytest

from nodekit.launcher.linkcheck.apart import Here
from nodekit.launcher.linkcheck.rounds import ALL_PAIRS_MAX, NARROW_ROUNDS, SURVEY_ROUNDS
from nodekit.launcher.linkcheck.run import LinkJob, run
from nodekit.launcher.linkcheck.verdict import LinkVerdict
from nodekit.launcher.store.client import Client
from nodekit.launcher.store.server import host
from tests.factories import shaper

SECRET = "job-secret-for-the-sampled-link-check"
N = 24
SLOW = 9  # rank; its address is 127.0.0.10
SLOW_ADDR = f"127.0.0.{SLOW + 1}"
RATE = 2.5e6  # bytes a second (20 Mbit/s) on the slow node's link; loopback between the others carries gigabits


def test_above_the_threshold_a_sample_of_pairs_names_the_slow_node(monkeypatch: pytest.MonkeyPatch) -> None:
    assert N > ALL_PAIRS_MAX
    monkeypatch.setattr(socket, "socket", shaper(SLOW_ADDR, RATE))  # every socket made from here on
    hosted = host(SECRET, 0, timeout_s=60, host="127.0.0.1")
    out: dict[int, LinkVerdict] = {}
    errors: list[BaseException] = []

    def node(r: int) -> None:
        try:
            store = hosted if r == 0 else Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=60, connect_s=10)
            job = LinkJob(r, N, f"h{r}", f"127.0.0.{r + 1}", "lo", SECRET, seconds=0.1)
            out[r] = run(store, job, hosted.run_id, meters=Here)  # in this process: the shaper is here
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=node, args=(r,), daemon=True) for r in range(N)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        hosted.close()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    v = out[0]
    assert all(out[r] == v for r in range(N))
    # a sample, not every pair: the survey's rounds (every node in each) and at most two rounds of re-tests
    assert len(v.pairs) <= (SURVEY_ROUNDS + NARROW_ROUNDS) * N // 2 < N * (N - 1) // 2
    met = Counter(x for p in v.pairs for x in (p.a, p.b))
    assert min(met[r] for r in range(N)) >= SURVEY_ROUNDS
    assert len({(p.a, p.b) for p in v.pairs}) == len(v.pairs)
    named = {(f.a, f.b) for f in v.findings}
    with_slow = {(p.a, p.b) for p in v.pairs if SLOW in (p.a, p.b)}
    assert len(with_slow) == SURVEY_ROUNDS + 1  # its four partners, then a known-good node it had not met
    assert with_slow <= named, v.findings
    assert v.suspects == (SLOW,), (v.suspects, [f.text for f in v.findings])
