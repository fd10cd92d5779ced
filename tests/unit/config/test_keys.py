"""A refused setting is named where it is written (file and line) and a typo gets the key it was meant to be."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.config.keys import did_you_mean, known_keys, line_of
from nodekit.config.settings import Settings, load
from nodekit.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "line", "where", "fix"),
    [
        ('name = "x"\nnproc_per_nodes = 1\n', 2, "unknown setting nproc_per_nodes", "did you mean nproc_per_node?"),
        ('name = "x"\n\n[[mount]]\nhost = "/a"\n', 3, "unknown setting mount", "did you mean mounts?"),
        ('[nodes.1]\nifce = "eth0"\n', 2, "unknown setting [nodes.1] ifce", "did you mean iface?"),
        ('[slurm]\npartitoin = "gpu"\n', 2, "unknown setting [slurm] partitoin", "did you mean partition?"),
        (
            '[[mounts]]\nhost = "/a"\ncontainer = "/b"\n[[mounts]]\nhost = "/c"\ncontainer = "/d"\nchek = "sizes"\n',
            7,
            "unknown setting [[mounts]] #2 chek",
            "did you mean check?",
        ),
        ("master-port = 29500\n", 1, "unknown setting master-port", "did you mean master_port?"),
        ('name = "x"\n[enviroment]\nA = "1"\n', 2, "unknown setting enviroment", "did you mean env?"),
        ('name = "x"\n[environment]\nA = "1"\n', 2, "unknown setting environment", "did you mean env?"),
    ],
)
def test_a_typo_is_named_at_its_line_with_the_key_it_meant(
    project: Path, text: str, line: int, where: str, fix: str
) -> None:
    (project / "nodekit.toml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load()
    one = e.value.one_line()
    assert one.startswith(f"nodekit.toml:{line}: {where}."), one
    assert f"Fix: {fix}" in one
    assert e.value.exit_code == 2


def test_an_unknown_key_far_from_any_gets_no_guess(project: Path) -> None:
    (project / "nodekit.toml").write_text("zzzz = 1\n")
    with pytest.raises(ConfigError) as e:
        load()
    assert "did you mean" not in e.value.one_line() and "remove zzzz" in e.value.one_line()


def test_a_bad_value_is_named_at_its_line_or_at_the_variable_that_set_it(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "nodekit.toml").write_text('name = "x"\n# a comment\nnnodes = 0\n')
    with pytest.raises(ConfigError, match=r"^nodekit.toml:3: invalid setting nnodes"):
        load()
    (project / "nodekit.toml").write_text('name = "x"\n')
    monkeypatch.setenv("NODEKIT_NNODES", "0")
    with pytest.raises(ConfigError, match=r"^NODEKIT_NNODES: invalid setting nnodes"):
        load()
    monkeypatch.delenv("NODEKIT_NNODES")
    with pytest.raises(ConfigError, match=r"^--nnodes: invalid setting nnodes"):
        load(nnodes=0)


def test_known_keys_follow_the_tables() -> None:
    assert "nproc_per_node" in known_keys(Settings, ())
    assert "project_dir" not in known_keys(Settings, ())  # set by load, not by the user
    assert set(known_keys(Settings, ("mounts", 0))) == {"host", "container", "writable", "check", "source"}
    assert "iface" in known_keys(Settings, ("nodes", "3"))
    assert "partition" in known_keys(Settings, ("slurm",))
    assert known_keys(Settings, ("nnodes",)) == ()


def test_did_you_mean() -> None:
    keys = known_keys(Settings, ())
    assert did_you_mean("nproc_per_nodes", keys) == "nproc_per_node"
    assert did_you_mean("mount", keys) == "mounts"
    assert did_you_mean("rdzv-timeout", keys) == "rdzv_timeout"
    assert did_you_mean("NNODES", keys) == "nnodes"
    assert did_you_mean("completely_unrelated", keys) is None


def test_line_of() -> None:
    text = 'name = "x"\n[env]\nA = "1"\n[nodes.1]\niface = "e"\n[[mounts]]\nhost = "/a"\n[[mounts]]\nhost = "/b"\n'
    assert line_of(text, ("name",)) == 1
    assert line_of(text, ("env", "A")) == 3
    assert line_of(text, ("nodes", "1", "iface")) == 5
    assert line_of(text, ("nodes", "1", "gpus")) == 4  # not written: its table
    assert line_of(text, ("mounts", 1, "host")) == 9
    assert line_of(text, ("nnodes",)) is None
    assert line_of('nodes = { 1 = { iface = "e" } }\n', ("nodes", "1", "iface")) == 1


def test_a_misspelt_script_gets_the_file_it_was_meant_to_be(tmp_path: Path) -> None:
    """``script = "trian.py"`` beside a train.py: the refusal names train.py, with its folder kept."""
    from nodekit.errors import UsageError
    from nodekit.job.gather import check_command

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    with pytest.raises(UsageError) as e:
        check_command(Settings(project_dir=tmp_path, name="x", script="src/trian.py"))
    assert e.value.fix == 'did you mean src/train.py? set script = "src/train.py" in nodekit.toml'
    with pytest.raises(UsageError) as far:
        check_command(Settings(project_dir=tmp_path, name="x", script="main.py"))
    assert "did you mean" not in (far.value.fix or "")
