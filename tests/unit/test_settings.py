"""One precedence: flags > NODEKIT_* environment > nodekit.toml > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.errors import ConfigError
from nodekit.settings import load


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_MASTER_PORT", "NODEKIT_CONFIG", "NODEKIT_PACKAGES", "NODEKIT_NAME"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "fromfile"\nnnodes = 3\nmaster_port = 30000\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NODEKIT_NNODES", raising=False)
    s = load()
    assert (s.nnodes, s.master_port, s.nproc_per_node, s.launcher) == (1, 29500, "auto", "torchrun")
    assert s.packages == ("torch==2.13.0",)
    assert s.project_dir == tmp_path


def test_file_beats_defaults(project: Path) -> None:
    s = load()
    assert (s.name, s.nnodes, s.master_port) == ("fromfile", 3, 30000)


def test_env_beats_file(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEKIT_NNODES", "5")
    s = load()
    assert s.nnodes == 5
    assert s.master_port == 30000  # untouched keys still come from the file


def test_flag_beats_env(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEKIT_NNODES", "5")
    assert load(nnodes=7).nnodes == 7
    assert load(nnodes=None).nnodes == 5  # a flag not given does not override


def test_config_path_from_env_and_project_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "custom.toml").write_text("nnodes = 4\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NODEKIT_CONFIG", str(other / "custom.toml"))
    s = load()
    assert s.nnodes == 4
    assert s.project_dir == other


def test_list_from_env_is_json(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEKIT_PACKAGES", '["torch==2.13.0", "numpy==2.1.0"]')
    assert load().packages == ("torch==2.13.0", "numpy==2.1.0")


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"master_port": 0}, "master_port"),
        ({"master_port": 70000}, "master_port"),
        ({"nnodes": 0}, "nnodes"),
        ({"peer_timeout": 2}, "peer_timeout"),
        ({"peer_timeout": -1}, "peer_timeout"),
    ],
)
def test_invalid_values_name_the_field(project: Path, flags: dict[str, int], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(**flags)
    assert field in e.value.message
    assert e.value.exit_code == 2


def test_unknown_key_in_file_is_refused(project: Path) -> None:
    (project / "nodekit.toml").write_text("nnodez = 2\n")
    with pytest.raises(ConfigError, match="nnodez"):
        load()


def test_broken_toml(project: Path) -> None:
    (project / "nodekit.toml").write_text("nnodes = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load()


def test_image_name_defaults_to_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "My Project_2"
    d.mkdir()
    monkeypatch.chdir(d)
    monkeypatch.delenv("NODEKIT_NAME", raising=False)
    assert load().image_name == "my-project_2"


def test_invalid_image_name(project: Path) -> None:
    with pytest.raises(ConfigError, match="name"):
        load(name="Bad Name")


def test_starter_file_loads_and_matches_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `nodekit init` writes must itself be a valid config that states the real defaults."""
    from nodekit.starter import starter_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nodekit.toml").write_text(starter_config("x"))
    s = load()
    assert (s.name, s.nnodes, s.master_port, s.peer_timeout, s.rdzv_timeout) == ("x", 2, 29500, 15, 180)
    assert s.packages == ("torch==2.13.0",) and s.script == "train.py"
