"""In a pod, MASTER_ADDR is pod 0's DNS name, published only once that pod exists: the launcher resolves it on the
node (NODEKIT_RESOLVE_MAIN=1), retrying until NODEKIT_RDZV_TIMEOUT, and hands the IP to everything after it."""

from __future__ import annotations

import pytest

from nodekit.launcher.config import EnvError, parse_env
from nodekit.launcher.preflight import network as netfacts

POD_ENV = {
    "MASTER_ADDR": "demo-0.demo",
    "MASTER_PORT": "29500",
    "NODE_RANK": "1",
    "NNODES": "2",
    "NPROC_PER_NODE": "1",
    "NODEKIT_RDZV_TIMEOUT": "30",
    "NODEKIT_RESOLVE_MAIN": "1",
    # Pinned so that the interface step does not depend on this machine's routes.
    "GLOO_SOCKET_IFNAME": "eth0",
}


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []
        self.lines: list[str] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.slept.append(s)
        self.t += s

    def kw(self) -> dict[str, object]:
        return {"now": self.now, "sleep": self.sleep, "log": self.lines.append}


def dns_after(seconds: float, clock: FakeClock, answer: list[str]) -> object:
    """A resolver that answers NXDOMAIN until ``seconds`` have passed on ``clock``, then ``answer``."""
    start = clock.t
    asked: list[str] = []

    def find(name: str) -> list[str]:
        asked.append(name)
        if clock.t - start < seconds:
            raise OSError(-2, "Name or service not known")
        return answer

    find.asked = asked  # type: ignore[attr-defined]
    return find


def test_the_name_is_resolved_once_pod_0_exists_and_the_ip_replaces_it() -> None:
    clock = FakeClock()
    find = dns_after(7, clock, ["10.244.1.7"])
    resolved = netfacts.resolve(POD_ENV, find=find, **clock.kw())  # type: ignore[arg-type]
    assert resolved == {"MASTER_ADDR": "10.244.1.7", "NCCL_SOCKET_IFNAME": "eth0"}
    assert find.asked == ["demo-0.demo"] * 8  # type: ignore[attr-defined]  # once a second, 0..7 s
    assert clock.lines == ["nodekit: main demo-0.demo is 10.244.1.7 (resolved in 7 s)"]
    # What launcher/main.py does next: the merged environment parses, with the IP as main.
    cfg = parse_env(POD_ENV | resolved)
    assert cfg.master_addr == "10.244.1.7" and cfg.node_rank == 1


def test_a_name_that_never_resolves_gives_up_at_the_rendezvous_timeout_with_a_named_cause() -> None:
    clock = FakeClock()
    find = dns_after(10_000, clock, [])
    assert netfacts.resolve(POD_ENV, find=find, **clock.kw()) == {}  # type: ignore[arg-type]
    assert clock.t - 1000.0 == pytest.approx(30.0)  # NODEKIT_RDZV_TIMEOUT, not a second more
    assert max(clock.slept) <= netfacts.RESOLVE_POLL_S
    assert any("waiting for main's name demo-0.demo" in line for line in clock.lines)
    with pytest.raises(EnvError, match=r"MASTER_ADDR='demo-0.demo' did not resolve .*kubectl get pods,svc"):
        parse_env(POD_ENV)


def test_a_loopback_answer_is_not_main() -> None:
    # /etc/hosts maps a machine's own name to 127.0.1.1 on Debian: every other node would find someone else.
    clock = FakeClock()
    find = dns_after(0, clock, ["127.0.1.1"])
    assert netfacts.resolve(POD_ENV | {"NODEKIT_RDZV_TIMEOUT": "5"}, find=find, **clock.kw()) == {}  # type: ignore[arg-type]
    assert any("only a loopback address" in line for line in clock.lines)
    assert netfacts.resolve_main("x", 5, find=lambda n: ["127.0.1.1", "10.0.0.9"], **clock.kw()) == "10.0.0.9"  # type: ignore[arg-type]


def test_ipv4_comes_first_from_the_real_resolver() -> None:
    assert netfacts.lookup("127.0.0.1") == ["127.0.0.1"]
    with pytest.raises(OSError):
        netfacts.lookup("no-such-host.invalid")


def test_without_the_switch_a_name_is_left_alone_as_before() -> None:
    # Compose files always carry an IP resolved once on the host; a name there stays an error, never a lookup.
    env = {k: v for k, v in POD_ENV.items() if k != "NODEKIT_RESOLVE_MAIN"}

    def find(name: str) -> list[str]:
        raise AssertionError("looked up without NODEKIT_RESOLVE_MAIN=1")

    assert netfacts.resolve(env, find=find) == {"NCCL_SOCKET_IFNAME": "eth0"}
    with pytest.raises(EnvError, match="is not an IP address"):
        parse_env(env)


def test_an_address_is_never_looked_up() -> None:
    def find(name: str) -> list[str]:
        raise AssertionError("an IP address was looked up")

    env = POD_ENV | {"MASTER_ADDR": "10.0.0.5"}
    assert netfacts.resolve(env, find=find) == {"NCCL_SOCKET_IFNAME": "eth0"}
