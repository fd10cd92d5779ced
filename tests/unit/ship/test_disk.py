"""A target engine's free disk: statvfs on this machine, ``df`` over SSH for an ssh:// node (with whether it has
zstd), unknown for tcp://; the survey hands it to the plan, which refuses a target without room before anything
moves."""

from __future__ import annotations

import pytest

from nodekit import ship
from nodekit.errors import ShipError
from nodekit.ship import disk, engines
from nodekit.system import docker

GiB = 1 << 30
NEW = "sha256:" + "a" * 64

GNU_DF = """\
Filesystem     1024-blocks      Used Available Capacity Mounted on
/dev/vda         263112772  36570420 214043552      15% /
"""
BUSYBOX_DF = """\
Filesystem           1024-blocks    Used Available Capacity Mounted on
tmpfs                    98304     2048     96256   2% /var/lib/docker
"""


def test_df_over_ssh_for_an_ssh_endpoint_with_user_and_port() -> None:
    argv = disk.df_argv("ssh://me@10.0.0.6:2222", "/var/lib/docker")
    assert argv == [
        "ssh", "-n", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "--", "me@10.0.0.6",
        "df -Pk -- /var/lib/docker && { command -v zstd >/dev/null 2>&1 && echo nodekit-zstd || true; }",
    ]  # fmt: skip
    assert disk.df_argv("ssh://node1", "/srv/docker data")[-1].startswith("df -Pk -- '/srv/docker data' && ")


@pytest.mark.parametrize("endpoint", ["tcp://10.0.0.6:2376", "unix:///var/run/docker.sock", "ssh://"])
def test_no_df_where_nodekit_cannot_ask(endpoint: str) -> None:
    assert disk.df_argv(endpoint, "/var/lib/docker") is None
    assert disk.target_disk(endpoint, "/var/lib/docker") == (None, False)


def test_parse_df_reads_the_available_column() -> None:
    assert disk.parse_df(GNU_DF) == 214043552 * 1024
    assert disk.parse_df(BUSYBOX_DF) == 96256 * 1024
    # a mount point with a space is still the last column's business, not the available one's
    assert disk.parse_df(GNU_DF.replace("% /", "% /mnt/my disk")) == 214043552 * 1024
    for bad in ("", "Filesystem 1024-blocks Used Available Capacity Mounted on\n", "df: /x: No such file\n"):
        assert disk.parse_df(bad) is None
    assert disk.parse_df(GNU_DF + "nodekit-zstd\n") == 214043552 * 1024  # the zstd line after the table


def _facts(free: int | None) -> docker.EngineFacts:
    return docker.EngineFacts("engine-n1", "26.1.5", "/var/lib/docker", free_bytes=free)


def test_the_survey_asks_an_ssh_node_its_free_disk_and_the_plan_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(docker, "engine_facts", lambda host: _facts(None))
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: None)
    monkeypatch.setattr(docker, "layer_lists", lambda host=None: [])

    def free(endpoint: str, root: str) -> disk.TargetDisk:
        asked.append((endpoint, root))
        return disk.TargetDisk(1 * GiB, True)

    monkeypatch.setattr(engines, "target_disk", free)
    src = ship.Source(ref="nodekit/cuda-demo:abc", image_id=NEW, size=6 * GiB, engine_id="engine-src")
    [st] = ship.survey(src, [ship.Target("n1", "ssh://me@n1")])
    assert asked == [("ssh://me@n1", "/var/lib/docker")] and st.free_bytes == 1 * GiB and st.zstd
    with pytest.raises(ShipError) as e:
        ship.plan_push(src, [st])
    assert e.value.node == "n1"
    assert "n1 has 1.0 GiB free for Docker" in e.value.message and "needs about 13.2 GiB" in e.value.message


def test_an_engine_on_this_machine_is_not_asked_over_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker, "engine_facts", lambda host: _facts(50 * GiB))
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: None)
    monkeypatch.setattr(docker, "layer_lists", lambda host=None: [])
    monkeypatch.setattr(engines, "target_disk", lambda *a: pytest.fail("asked over ssh"))
    src = ship.Source(ref="nodekit/cuda-demo:abc", image_id=NEW, size=6 * GiB, engine_id="engine-src")
    [st] = ship.survey(src, [ship.Target("local", "unix:///run/other.sock")])
    assert st.free_bytes == 50 * GiB
