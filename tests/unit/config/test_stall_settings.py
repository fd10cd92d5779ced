"""stall_timeout and stall_action from nodekit.toml to the launcher: defaults, bounds, one line per bad value, and
the environment every node's container gets (the launcher parses exactly what the host wrote)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.config.settings import Settings
from nodekit.errors import ConfigError
from nodekit.launcher import contract
from nodekit.launcher.config import EnvError, parse_env
from nodekit.launcher.contract import EXIT_STALLED
from tests.factories import node_env


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(project_dir=tmp_path, name="s", script="train.py", nnodes=2, **kw)  # type: ignore[arg-type]


def test_the_watch_is_on_by_default_and_reaches_every_nodes_launcher(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert (s.stall_timeout, s.stall_action) == (300, "stop")
    for kw, want in (({}, (300.0, "stop")), ({"stall_timeout": 0}, (0.0, "stop")),
                     ({"stall_timeout": 45, "stall_action": "warn"}, (45.0, "warn"))):  # fmt: skip
        env = node_env(1, **kw)
        cfg = parse_env(env)
        assert (cfg.stall_timeout, cfg.stall_action) == want, env
        assert cfg.worker_dir == "/tmp/nodekit-workers"


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"stall_timeout": 3}, "must be 0 (no stall watch) or at least 5 seconds, not 3"),
        ({"stall_timeout": -1}, "stall_timeout"),
        ({"stall_timeout": 604_801}, "is more than 604800 s"),
        ({"stall_action": "kill"}, "stall_action"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(tmp_path: Path, kw: dict[str, object], says: str) -> None:
    from nodekit.config.settings import load

    (tmp_path / "nodekit.toml").write_text(
        'name = "s"\nscript = "train.py"\n' + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in kw.items())
    )
    with pytest.raises(ConfigError) as e:
        load(tmp_path / "nodekit.toml")
    assert says in e.value.one_line() and next(iter(kw)) in e.value.one_line()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"NODEKIT_STALL_TIMEOUT": "soon"}, "NODEKIT_STALL_TIMEOUT='soon' is not a number of seconds"),
        ({"NODEKIT_STALL_TIMEOUT": "2"}, "NODEKIT_STALL_TIMEOUT=2 must be 0 (no stall watch) or 5 to 604800 seconds"),
        ({"NODEKIT_STALL_ACTION": "kill"}, "NODEKIT_STALL_ACTION='kill' is not one of stop, warn"),
    ],
)
def test_a_hand_edited_compose_file_is_refused_by_the_launcher(env: dict[str, str], says: str) -> None:
    base = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "NODE_RANK": "0", "NNODES": "2", "NPROC_PER_NODE": "1"}
    with pytest.raises(EnvError, match="^" + says.replace("(", r"\(").replace(")", r"\)") + "$"):
        parse_env(base | env)


def test_a_stall_has_an_exit_code_of_its_own() -> None:
    codes = [getattr(contract, n) for n in contract.__all__ if n.startswith("EXIT_")]
    assert EXIT_STALLED == 22 and codes.count(EXIT_STALLED) == 1
