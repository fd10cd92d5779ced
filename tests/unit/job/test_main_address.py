"""Main's address when none is given: nodekit.toml's ``main``, else node 0's own address (issue 32: ``--main`` was
required on rank 0, which is main itself)."""

from __future__ import annotations

import pytest

from nodekit.config.settings import Settings
from nodekit.errors import UsageError
from nodekit.job.spec import main_address
from nodekit.system.host.net import Link, default_address


def _settings(**kw: object) -> Settings:
    return Settings(name="t", script="train.py", **kw)  # type: ignore[arg-type]


def test_the_flag_then_the_setting_then_node_zeros_own_address() -> None:
    here = lambda: "10.0.0.5"  # noqa: E731
    assert main_address(_settings(nnodes=2, main="10.0.0.9"), 1, "10.0.0.7", here) == "10.0.0.7"
    assert main_address(_settings(nnodes=2, main="10.0.0.9"), 1, None, here) == "10.0.0.9"
    assert main_address(_settings(nnodes=2), 0, None, here) == "10.0.0.5"
    assert main_address(_settings(nnodes=1), 0, None, here) == "127.0.0.1"


def test_a_worker_without_main_and_node_zero_without_a_route_name_the_fix() -> None:
    with pytest.raises(UsageError, match="main's address is not known") as e:
        main_address(_settings(nnodes=2), 1, None, lambda: "10.0.0.5")
    assert e.value.fix is not None and "--main" in e.value.fix
    with pytest.raises(UsageError, match="no default route"):
        main_address(_settings(nnodes=2), 0, None, lambda: None)


def test_default_address_is_the_default_routes_interface_address() -> None:
    links = [
        Link("lo", addrs=("127.0.0.1", "::1")),
        Link("eth0", addrs=("fe80::1", "fd00::2", "192.0.2.2")),
        Link("eth1", addrs=("10.1.0.3",)),
    ]
    route = '[{"dst":"default","gateway":"192.0.2.1","dev":"eth0","flags":[]}]'
    assert default_address(route, links) == "192.0.2.2"  # IPv4 before IPv6, never link-local
    assert default_address('[{"dst":"default","dev":"eth1"}]', links) == "10.1.0.3"
    assert default_address("[]", links) is None
    assert default_address("not json", links) is None
    assert default_address('[{"dst":"default","dev":"lo"}]', links) is None
