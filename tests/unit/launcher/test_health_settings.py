"""[health] in nodekit.toml -> the node's environment -> the launcher's config: one path, checked end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.config.settings import load
from nodekit.errors import ConfigError
from nodekit.launcher.config import EnvError, parse_env
from tests.factories import node_env


def test_the_defaults_render_nothing_and_parse_to_warn() -> None:
    env = node_env()
    assert not [k for k in env if k.startswith(("NODEKIT_LINK", "NODEKIT_MIN_LINK", "NODEKIT_GPU", "NODEKIT_DCGM"))]
    cfg = parse_env(env)
    assert (cfg.link_check, cfg.min_link_gbit, cfg.link_seconds, cfg.gpu_health, cfg.dcgm) == (
        "warn", None, 0.2, "warn", True,
    )  # fmt: skip
    assert cfg.checks_only is False


def test_every_health_setting_reaches_the_launcher() -> None:
    health = {"links": "refuse", "min_link_gbit": 25, "link_seconds": 0.5, "gpus": "off", "dcgm": False}
    env = node_env(health=health)
    assert {
        k: v for k, v in env.items() if k.startswith(("NODEKIT_LINK", "NODEKIT_MIN", "NODEKIT_GPU", "NODEKIT_DCGM"))
    } == {
        "NODEKIT_LINK_CHECK": "refuse",
        "NODEKIT_MIN_LINK_GBIT": "25",
        "NODEKIT_LINK_SECONDS": "0.5",
        "NODEKIT_GPU_HEALTH": "off",
        "NODEKIT_DCGM": "0",
    }
    cfg = parse_env(env)
    assert (cfg.link_check, cfg.min_link_gbit, cfg.link_seconds, cfg.gpu_health, cfg.dcgm) == (
        "refuse", 25.0, 0.5, "off", False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ('[health]\nlinks = "strict"\n', "links"),
        ("[health]\nmin_link_gbit = 0\n", "min_link_gbit"),
        ("[health]\nlink_seconds = 60\n", "link_seconds"),
        ('[health]\ngpu = "warn"\n', "gpu"),
    ],
)
def test_bad_health_settings_are_one_line(tmp_path: Path, toml: str, match: str) -> None:
    (tmp_path / "nodekit.toml").write_text('script = "train.py"\n' + toml)
    with pytest.raises(ConfigError, match=match) as e:
        load(tmp_path / "nodekit.toml")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("NODEKIT_LINK_CHECK", "maybe", "NODEKIT_LINK_CHECK='maybe' is not one of warn, refuse, off"),
        ("NODEKIT_GPU_HEALTH", "on", "NODEKIT_GPU_HEALTH='on' is not one of"),
        ("NODEKIT_MIN_LINK_GBIT", "fast", "is not a number"),
        ("NODEKIT_LINK_SECONDS", "9", "outside 0.05..5"),
        ("NODEKIT_CHECKS_ONLY", "perhaps", "is not a boolean"),
    ],
)
def test_a_hand_edited_compose_file_is_refused_naming_the_variable(key: str, value: str, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        parse_env({**node_env(), key: value})
