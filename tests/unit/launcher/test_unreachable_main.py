"""A wrong main address is named as such within seconds, not at the rendezvous deadline (issue 32: "no route to
host" was known after 3 s, and the node still waited 180 s as if main were only late)."""

from __future__ import annotations

import pytest

from nodekit.launcher.config import LaunchConfig, parse_env
from nodekit.launcher.preflight import exchange
from nodekit.launcher.preflight.exchange import Clock, PreflightError, wait_reachable

ENV = {
    "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500", "NODE_RANK": "1", "NNODES": "2", "NPROC_PER_NODE": "1",
    "WORLD_SIZE": "2", "NODEKIT_NAME": "t", "NODEKIT_LAUNCHER": "torchrun", "NODEKIT_RDZV_TIMEOUT": "180",
    "NODEKIT_PREFLIGHT_PORT": "29501", "NODEKIT_OUTPUT_DIR": "/outputs",
}  # fmt: skip


class FakeTime:
    """The clock wait_reachable runs on; each probe costs ``cost`` seconds (the kernel's answer time)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.lines: list[str] = []

    def clock(self) -> Clock:
        return Clock(now=lambda: self.t, sleep=self.sleep, log=self.lines.append)

    def sleep(self, s: float) -> None:
        self.t += s


def _cfg() -> LaunchConfig:
    return parse_env(ENV)


def _answers(time: FakeTime, monkeypatch: pytest.MonkeyPatch, *answers: tuple[str | None, float]) -> None:
    """Probes answer ``(reason, seconds)`` in turn, the last one for ever."""
    queue = list(answers)

    def probe(addr: str, port: int, timeout: float) -> tuple[str | None, str | None]:
        reason, cost = queue.pop(0) if len(queue) > 1 else queue[0]
        time.t += min(cost, timeout)
        if cost > timeout:
            return "timed out", None
        return reason, (None if reason else "10.0.0.6")

    monkeypatch.setattr(exchange, "probe", probe)


@pytest.mark.parametrize(("reason", "cost"), [("no route to host", 3.0), ("network unreachable", 0.0)])
def test_an_unreachable_main_is_named_within_ten_seconds(
    reason: str, cost: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    time = FakeTime()
    _answers(time, monkeypatch, (reason, cost))
    with pytest.raises(PreflightError) as e:
        wait_reachable(_cfg(), deadline=180.0, clock=time.clock())
    assert time.t < 10, f"named after {time.t:.1f} s"
    said = str(e.value)
    assert said.startswith(f"main 10.0.0.9:29501 is unreachable from this node ({reason}")
    assert "the main address is wrong" in said and "--main" in said and "ip route get 10.0.0.9" in said


def test_a_refusing_or_silent_main_is_still_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Main's machine is there (refused: its launcher is not up yet), or a firewall drops: wait to the deadline."""
    time = FakeTime()
    _answers(time, monkeypatch, ("connection refused", 0.0), ("no route to host", 3.0), ("connection refused", 0.0),
             ("timed out", 9.0))  # fmt: skip
    with pytest.raises(PreflightError, match=r"cannot reach main 10.0.0.9:29501 \(timed out\); gave up after"):
        wait_reachable(_cfg(), deadline=180.0, clock=time.clock())
    assert time.t >= 180


def test_one_unreachable_answer_then_main_comes_up(monkeypatch: pytest.MonkeyPatch) -> None:
    time = FakeTime()
    _answers(time, monkeypatch, ("no route to host", 3.0), (None, 0.0))
    assert wait_reachable(_cfg(), deadline=180.0, clock=time.clock()) == "10.0.0.6"


def test_a_probe_waits_longer_than_the_kernels_neighbour_resolution() -> None:
    """A connect attempt shorter than ARP's 3 s ends as "timed out" before the kernel can say "no route to host"."""
    assert exchange.PROBE_S > 3.0
    # and the reasons the fast path acts on are the ones probe() reports
    assert set(exchange._REASONS.values()) >= exchange.UNREACHABLE
