"""mounts: host directories in the job, read-only unless asked, per-node host paths, missing ones refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nodekit.config.settings import Mount, NodeOverride, Settings, load
from nodekit.errors import ConfigError, UsageError
from tests.factories import CPU_NODE, plan_here, rendered, settings

DATA = Mount(host="/srv/data", container="/data", check="sizes")
CACHE = Mount(host="/srv/cache", container="/root/.cache", writable=True)


def _svc(rank: int, **kw: object) -> dict[str, object]:
    doc = yaml.safe_load(rendered(settings(nproc_per_node=1, mounts=(DATA, CACHE), **kw), rank, CPU_NODE))
    return dict(doc["services"]["train"])


def test_mounts_are_read_only_unless_asked_and_never_created() -> None:
    volumes = _svc(0)["volumes"]
    assert volumes[1:] == [  # type: ignore[index]
        {
            "type": "bind",
            "source": "/srv/data",
            "target": "/data",
            "read_only": True,
            "bind": {"create_host_path": False},
        },
        {
            "type": "bind",
            "source": "/srv/cache",
            "target": "/root/.cache",
            "read_only": False,
            "bind": {"create_host_path": False},
        },
    ]
    assert _svc(0)["environment"]["NODEKIT_DATA_CHECK"] == "/data:sizes"  # type: ignore[index]


def test_a_node_can_have_its_own_host_path() -> None:
    kw = {"nodes": {1: NodeOverride(mounts={"/data": "/mnt/nvme/data"})}}
    assert _svc(0, **kw)["volumes"][1]["source"] == "/srv/data"  # type: ignore[index]
    assert _svc(1, **kw)["volumes"][1]["source"] == "/mnt/nvme/data"  # type: ignore[index]


def test_a_missing_host_path_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    mounts = (Mount(host=str(tmp_path / "absent"), container="/data"),)
    s = Settings(project_dir=tmp_path, name="demo", script="train.py", nnodes=2, mounts=mounts)
    with pytest.raises(UsageError, match=r"mount .*absent \(for /data\) does not exist on node 0") as e:
        plan_here(s, 0, "10.0.0.5", image="x:y", facts=CPU_NODE)
    assert "[nodes.0] mounts" in e.value.fix
    assert not (tmp_path / "compose").exists()


def test_a_relative_host_path_is_the_project_s_wherever_nodekit_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nodekit init` keeps data/ out of the image; `host = "data"` mounts the project's data/ (issue 46), resolved
    against the project directory, not the shell's: the same file works from any directory, and on the node."""
    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("")
    (project / "nodekit.toml").write_text(
        'name = "demo"\nscript = "train.py"\nnnodes = 2\n[[mounts]]\nhost = "./data/"\ncontainer = "/data"\n'
        '[[mounts]]\nhost = "../shared"\ncontainer = "/shared"\n[nodes.1]\nmounts = { "/shared" = "cache" }\n'
    )
    (tmp_path / "shared").mkdir()
    (project / "cache").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    s = load(project / "nodekit.toml")
    assert [m.host for m in s.mounts] == ["data", "../shared"]
    volumes = {
        v["target"]: v["source"] for v in yaml.safe_load(rendered(s, 0, CPU_NODE))["services"]["train"]["volumes"]
    }
    assert volumes["/data"] == str(project / "data") and volumes["/shared"] == str(tmp_path / "shared")
    plan = plan_here(s, 1, "10.0.0.5", image="x:y", facts=CPU_NODE)
    assert f"source: {project / 'cache'}" in plan.text  # a node's own path may be relative too
    (project / "data").rmdir()
    with pytest.raises(UsageError, match=rf"mount {project / 'data'} \(for /data\) does not exist on node 0"):
        plan_here(s, 0, "10.0.0.5", image="x:y", facts=CPU_NODE)


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ('[[mounts]]\nhost = "."\ncontainer = "/data"\n', "neither absolute nor a path relative to the project"),
        ('[[mounts]]\nhost = "/srv/data"\ncontainer = "data"\n', "not absolute"),
        ('[[mounts]]\nhost = "/srv/data"\ncontainer = "/outputs"\n', "nodekit's own"),
        ('[[mounts]]\nhost = "/a"\ncontainer = "/data"\n[nodes.1]\nmounts = { "/data" = "./" }\n', "neither absolute"),
        ('[[mounts]]\nhost = "/a"\ncontainer = "/data"\n[nodes.1]\nmounts = { "/other" = "/b" }\n', "no \\[\\[mounts"),
    ],
)
def test_bad_mounts_are_one_line(tmp_path: Path, toml: str, match: str) -> None:
    (tmp_path / "nodekit.toml").write_text('script = "t.py"\nnnodes = 2\n' + toml)
    with pytest.raises(ConfigError, match=match) as e:
        load(tmp_path / "nodekit.toml")
    assert "\n" not in str(e.value)


def test_a_mount_s_host_path_is_decided_beside_the_node_s_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """job/spec decides where a mount lands on the node's engine (with the node's mounts), not the settings: a
    relative host path is the project's, anchored where nodekit runs when the project directory is relative."""
    from nodekit.job.spec import host_path, mount_points

    monkeypatch.chdir(tmp_path)
    mounts = (Mount(host="data", container="/data"), Mount(host="/srv/x", container="/x"))
    s = Settings(project_dir=Path("proj"), name="demo", script="train.py", mounts=mounts)
    assert host_path(s, "../shared") == str(tmp_path / "shared")
    assert [m.host for m in mount_points(s, 0)] == [str(tmp_path / "proj" / "data"), "/srv/x"]
