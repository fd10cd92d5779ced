"""Per-node facts: the launcher resolves the interface toward main on the node; render writes only what is pinned."""

from __future__ import annotations

from pathlib import Path

import yaml

from nodekit.backends.compose.render import render_compose
from nodekit.config.settings import NodeOverride, Settings
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec, pinned_host_facts
from nodekit.launcher.preflight import network as netfacts
from nodekit.system.host.facts import HostFacts

HEAD = HostFacts(gpu_count=0, iface="eth0", local_addr="10.0.0.5")


def test_loopback_resolves_to_lo_on_this_machine() -> None:
    assert netfacts.source_addr("127.0.0.1") == "127.0.0.1"
    assert netfacts.iface_addr("lo") == "127.0.0.1"
    assert netfacts.iface_holding("127.0.0.1") == "lo"
    assert netfacts.resolve({"MASTER_ADDR": "127.0.0.1"}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def test_a_pin_wins_and_fills_the_other_variable() -> None:
    assert netfacts.resolve({"MASTER_ADDR": "127.0.0.1", "NCCL_SOCKET_IFNAME": "ens5"}) == {
        "GLOO_SOCKET_IFNAME": "ens5"
    }
    assert netfacts.resolve({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "a", "NCCL_SOCKET_IFNAME": "b"}) == {}


def test_nothing_resolved_without_a_usable_main() -> None:
    assert netfacts.resolve({}) == {}
    assert netfacts.resolve({"MASTER_ADDR": "main.example"}) == {}
    assert netfacts.iface_addr("no-such-if0") is None


def _env(s: Settings, rank: int, facts: HostFacts, main: str = "10.0.0.5") -> dict[str, str]:
    facts = pinned_host_facts(s, rank, facts)
    node = node_spec(s, launch_spec(s), rank, main, facts)
    doc = render_compose(plan_container(node, facts, image="img", output_dir=Path("/o")))
    env: dict[str, str] = doc["services"]["train"]["environment"]
    return env


def test_a_file_rendered_on_the_head_does_not_carry_the_heads_interface() -> None:
    s = Settings(project_dir=Path("/p"), name="d", script="t.py", nnodes=3)
    env = _env(s, 1, HEAD)
    assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" not in env
    assert "eth0" not in yaml.safe_dump(env)


def test_pinned_interface_and_gpus_come_from_the_config() -> None:
    s = Settings(
        project_dir=Path("/p"), name="d", script="t.py", nnodes=3, nodes={2: NodeOverride(iface="ens5", gpus=4)}
    )
    env = _env(s, 2, HEAD)
    assert env["GLOO_SOCKET_IFNAME"] == "ens5" and env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert env["NPROC_PER_NODE"] == "4"  # auto = the node's GPUs, from the config, on a CPU-only head
    facts = pinned_host_facts(s, 2, HEAD)
    doc = render_compose(
        plan_container(node_spec(s, launch_spec(s), 2, "10.0.0.5", facts), facts, image="img", output_dir=Path("/o"))
    )
    assert doc["services"]["train"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
