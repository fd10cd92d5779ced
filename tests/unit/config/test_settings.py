"""One precedence: flags > NODEKIT_* environment > nodekit.toml > defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodekit.config.settings import load
from nodekit.errors import ConfigError


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
    from nodekit.config.starter import starter_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nodekit.toml").write_text(starter_config("x"))
    s = load()
    assert (s.name, s.nnodes, s.master_port, s.peer_timeout, s.rdzv_timeout) == ("x", 2, 29500, 15, 180)
    assert s.packages == ("torch==2.13.0",) and s.script == "train.py"


# --- the whole input space ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "where", "fix"),
    [
        ({"nproc_per_node": 0}, "nproc_per_node", 'nproc_per_node = "auto"'),
        ({"nproc_per_node": 1025}, "nproc_per_node", "a count such as 8"),
        ({"nodes": {1: {"nproc_per_node": 0}}, "nnodes": 2}, "[nodes.1] nproc_per_node", 'nproc_per_node = "auto"'),
        ({"nodes": {1: {"addr": "garbage!!"}}, "nnodes": 2}, "[nodes.1] addr", "remove addr"),
        ({"nodes": {1: {"iface": "eth0/1"}}, "nnodes": 2}, "[nodes.1] iface", "ip -br link"),
        ({"env": {"NODE_RANK=0 X": "1"}}, "env", "rename it in env"),
        ({"env": {"": "1"}}, "env", "rename it in env"),
        ({"env": {"A B": "1"}}, "env", "rename it in env"),
        ({"pass_env": ("RANK",)}, "pass_env", "remove RANK from pass_env"),
        ({"env": {"TOKEN": "x"}, "pass_env": ("TOKEN",)}, "pass_env", "keep TOKEN in one of them"),
        ({"rdzv_timeout": 10**14}, "rdzv_timeout", "in seconds"),
        ({"peer_timeout": 604801}, "peer_timeout", "in seconds"),
        ({"nnodes": 10**7}, "nnodes", "between 1 and 10000"),
        ({"mounts": [{"host": "/d", "container": "/data,x", "check": "sizes"}]}, "[[mounts]] #1", "elsewhere"),
        ({"mounts": [{"host": "/d/../e", "container": "/data"}]}, "[[mounts]] #1 host", "absolute path"),
        ({"script": "../up.py"}, "script", "inside the project"),
        ({"module": "pkg train"}, "module", 'module = "pkg.train"'),
        ({"main": "two words"}, "main", 'main = "10.0.0.5"'),
        ({"args": ("ok", "a\x00b")}, "args.1", "without it"),
        ({"packages": ("torch==2.13.0", " ")}, "packages", "remove the empty string"),
        ({"python_version": "3.11.7"}, "python_version", 'python_version = "3.11"'),
        ({"wheel_platform": "manylinux 2"}, "wheel_platform", "manylinux_2_36_x86_64"),
    ],
)
def test_each_bad_value_is_one_line_naming_the_setting_and_the_fix(
    project: Path, flags: dict[str, object], where: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(**flags)
    line = e.value.one_line()
    # after where it was set: load()'s keyword arguments stand for the command's flags (--nnodes: ...)
    assert re.match(rf"^(--[a-z_-]+: |the arguments after --: )?invalid setting {re.escape(where)}: ", line), line
    assert fix in line.split(" Fix: ", 1)[1], line
    assert "\n" not in line and e.value.exit_code == 2


@pytest.mark.parametrize(
    ("flags", "field", "value"),
    [
        ({"nnodes": 10_000}, "nnodes", 10_000),
        ({"nproc_per_node": 1024}, "nproc_per_node", 1024),
        ({"rdzv_timeout": 604_800, "peer_timeout": 604_800}, "rdzv_timeout", 604_800),
        ({"args": ("exp-$USER", "one\ntwo", "\tx")}, "args", ("exp-$USER", "one\ntwo", "\tx")),
        ({"main": "head_node.local."}, "main", "head_node.local."),
    ],
)  # fmt: skip
def test_values_at_the_bounds_are_accepted(project: Path, flags: dict[str, object], field: str, value: object) -> None:
    assert getattr(load(**flags), field) == value


def test_a_long_directory_name_still_makes_a_valid_image_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / ("x" * 200)
    d.mkdir()
    monkeypatch.chdir(d)
    monkeypatch.delenv("NODEKIT_NAME", raising=False)
    assert load().image_name == "x" * 128


def test_a_value_from_the_shell_that_is_not_utf8_is_refused(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.environ hands undecodable bytes over as lone surrogates; written to a compose file they would crash."""
    monkeypatch.setenv("NODEKIT_ENV", '{"A": "x\\udcff"}')
    with pytest.raises(ConfigError, match=r"invalid setting env.A: .*not valid UTF-8"):
        load()


def test_a_config_file_that_is_not_utf8_is_one_line(project: Path) -> None:
    (project / "nodekit.toml").write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"is not UTF-8 \(byte 0xe9 on line 1\)"):
        load()


def test_a_directory_given_as_the_config_is_one_line(project: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load(project)


@pytest.mark.parametrize(
    ("make", "key", "where"),
    [
        (".nodekit", ".nodekit", ".nodekit"),
        ("compose", "compose_dir", "compose"),
        ("outputs", "output_dir", "outputs"),
    ],
)
def test_a_file_where_nodekit_keeps_a_directory_is_refused_before_anything(
    project: Path, make: str, key: str, where: str
) -> None:
    (project / make).write_text("in the way\n")
    with pytest.raises(ConfigError, match=rf"{key} .* cannot be a directory: .*{where} is a file"):
        load()


def test_a_file_above_compose_dir_is_refused(project: Path) -> None:
    (project / "train.py").write_text("print(1)\n")
    with pytest.raises(ConfigError, match=r"compose_dir .*train\.py is a file"):
        load(compose_dir=Path("train.py/compose"))


def test_the_launcher_refuses_what_nodekit_toml_may_not_hold() -> None:
    """A compose file edited by hand gets the same bound at container start, not an OverflowError."""
    from nodekit.launcher.config import EnvError, parse_env

    base = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "NODE_RANK": "0", "NNODES": "1", "NPROC_PER_NODE": "1"}
    assert parse_env(base | {"NODEKIT_RDZV_TIMEOUT": "604800"}).rdzv_timeout == 604800
    for key, value in [
        ("NODEKIT_RDZV_TIMEOUT", "1e14"),
        ("NODEKIT_RDZV_TIMEOUT", "inf"),
        ("NODEKIT_PEER_TIMEOUT", "1e14"),
    ]:
        with pytest.raises(EnvError, match=key):
            parse_env(base | {key: value})


def test_the_most_nodes_fit_in_one_environment_string() -> None:
    """Why nnodes stops at 10,000 (nodekit/config/inputs.py): the per-node lists in the environment stay under Linux's
    128 KiB per string, at the most processes and GPUs per node, declared for every node."""
    from nodekit.backends.compose.render import render_compose
    from nodekit.config.inputs import MAX_ARG_BYTES, MAX_NODES, MAX_PROCS
    from nodekit.config.settings import NodeOverride, Settings
    from nodekit.job.plan import plan_container
    from nodekit.job.spec import launch_spec, node_spec
    from nodekit.system.host.facts import HostFacts

    nodes = {r: NodeOverride(gpus=MAX_PROCS) for r in range(MAX_NODES)}
    s = Settings(
        project_dir=Path("/p"), name="big", script="t.py", nnodes=MAX_NODES, nproc_per_node=MAX_PROCS, nodes=nodes
    )
    facts = HostFacts(iface="eth0")
    node = node_spec(s, launch_spec(s), MAX_NODES - 1, "10.0.0.5", facts)
    env = render_compose(plan_container(node, facts, image="x:y", output_dir=Path("/o")))["services"]["train"][
        "environment"
    ]
    longest = max(len(f"{k}={v}".encode()) for k, v in env.items() if v is not None)
    assert 90_000 < longest <= MAX_ARG_BYTES, longest
