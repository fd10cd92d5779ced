"""The launcher's environment contract: what nodekit/job/env.py sets parses; anything else names the variable."""

from __future__ import annotations

import pytest

from nodekit.launcher.config import EnvError, parse_env
from tests.factories import LAUNCH_ENV


def test_the_rendered_environment_parses() -> None:
    cfg = parse_env(LAUNCH_ENV)
    assert (cfg.master_addr, cfg.master_port, cfg.node_rank, cfg.nnodes) == ("10.0.0.5", 29500, 1, 2)
    assert (cfg.nproc_per_node, cfg.world_size, cfg.mode, cfg.max_restarts) == (4, 8, "torchrun", 0)
    assert (cfg.rdzv_timeout, cfg.preflight, cfg.preflight_port) == (180.0, True, 29501)
    assert (cfg.iface, cfg.fingerprint, cfg.output_dir, cfg.name) == (
        "eth0",
        "3f2a9c1b0d4e5566",
        "/outputs",
        "ddp-demo",
    )
    assert not cfg.is_main and not cfg.allow_heterogeneous_gpus


def test_defaults_for_everything_optional() -> None:
    required = {k: LAUNCH_ENV[k] for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "NPROC_PER_NODE")}
    cfg = parse_env(required)
    assert cfg.world_size is None and cfg.mode == "torchrun" and cfg.preflight_port == 29501
    assert cfg.rdzv_timeout == 180.0 and cfg.output_dir == "/outputs" and cfg.iface is None and cfg.fingerprint == ""


@pytest.mark.parametrize("key", ["MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "NPROC_PER_NODE"])
def test_a_missing_required_variable_is_named(key: str) -> None:
    env = {k: v for k, v in LAUNCH_ENV.items() if k != key}
    with pytest.raises(EnvError, match=rf"^{key} is not set"):
        parse_env(env)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("MASTER_ADDR", "main.example", "MASTER_ADDR='main.example' is not an IP address"),
        ("MASTER_PORT", "http", "MASTER_PORT='http' is not an integer"),
        ("MASTER_PORT", "70000", "MASTER_PORT=70000 is outside 1..65535"),
        ("NODE_RANK", "2", r"NODE_RANK=2 is outside 0..1 \(NNODES=2\)"),
        ("NODE_RANK", "-1", "NODE_RANK=-1 is outside 0..inf"),
        ("NNODES", "0", "NNODES=0 is outside 1..inf"),
        ("NPROC_PER_NODE", "auto", "NPROC_PER_NODE='auto' must be resolved"),
        ("NODEKIT_LAUNCHER", "deepspeed", "NODEKIT_LAUNCHER='deepspeed' is not one of"),
        ("NODEKIT_RDZV_TIMEOUT", "soon", "NODEKIT_RDZV_TIMEOUT='soon' is not a number"),
        ("NODEKIT_RDZV_TIMEOUT", "0", "NODEKIT_RDZV_TIMEOUT=0 must be more than 0"),
        ("NODEKIT_PEER_TIMEOUT", "soon", "NODEKIT_PEER_TIMEOUT='soon' is not a number"),
        ("NODEKIT_PEER_TIMEOUT", "2", r"NODEKIT_PEER_TIMEOUT=2 must be 0 \(no peer watchdog\) or at least 3 seconds"),
        ("NODEKIT_PEER_TIMEOUT", "-1", "NODEKIT_PEER_TIMEOUT=-1 must be 0"),
        ("NODEKIT_PREFLIGHT", "maybe", "NODEKIT_PREFLIGHT='maybe' is not a boolean"),
        ("NODEKIT_PREFLIGHT_PORT", "29500", "NODEKIT_PREFLIGHT_PORT=29500 must differ from MASTER_PORT"),
    ],
)
def test_a_bad_value_is_named_in_one_line(key: str, value: str, message: str) -> None:
    with pytest.raises(EnvError, match=message) as info:
        parse_env({**LAUNCH_ENV, key: value})
    assert "\n" not in str(info.value)


def test_switches() -> None:
    cfg = parse_env(
        {**LAUNCH_ENV, "NODEKIT_PREFLIGHT": "0", "NODEKIT_ALLOW_HETEROGENEOUS_GPUS": "1", "NODEKIT_LAUNCHER": "env"}
    )
    assert not cfg.preflight and cfg.allow_heterogeneous_gpus and cfg.mode == "env"
    assert parse_env({**LAUNCH_ENV, "MASTER_ADDR": "fd00::5"}).master_addr == "fd00::5"
    assert parse_env({**LAUNCH_ENV, "NODEKIT_RDZV_TIMEOUT": "2.5"}).rdzv_timeout == 2.5


def test_peer_timeout_defaults_to_15_s_and_0_turns_the_watchdog_off() -> None:
    assert parse_env(LAUNCH_ENV).peer_timeout == 15.0
    assert parse_env({**LAUNCH_ENV, "NODEKIT_PEER_TIMEOUT": "0"}).peer_timeout == 0.0
    assert parse_env({**LAUNCH_ENV, "NODEKIT_PEER_TIMEOUT": "7.5"}).peer_timeout == 7.5
