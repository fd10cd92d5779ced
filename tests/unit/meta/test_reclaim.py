"""What tests/reclaim.py gives back before the heavy tiers: only what is stale, least recently used first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import CLUSTER_NAMES
from tests.reclaim import (
    GIB,
    NEED_GIB,
    Room,
    big_images,
    blobs_over_cap,
    group_roots,
    idle_roots,
    is_test_repo,
    older_tags,
    removal_order,
    stale_pytest_folders,
)


def _session(root: Path, n: int, pid: int | None) -> Path:
    d = root / f"pytest-{n}"
    d.mkdir(parents=True)
    if pid is not None:
        (d / ".lock").write_text(str(pid))
    return d


def test_a_pytest_folder_is_stale_when_its_session_is_over(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)
    ended = _session(tmp_path, 1, None)  # a session that ended removes its lock
    killed = _session(tmp_path, 2, dead_pid)  # a killed one leaves its lock, naming a pid that is gone
    live = _session(tmp_path, 3, os.getpid())  # this session's
    (tmp_path / "pytest-current").symlink_to(live)
    assert stale_pytest_folders(tmp_path) == [ended, killed]


def test_blobs_over_the_cap_go_least_recently_used_first(tmp_path: Path) -> None:
    blobs = tmp_path / "sha256"
    blobs.mkdir()
    for name in ["old", "mid", "new"]:
        (blobs / name).write_bytes(b"x" * 1000)
        time.sleep(0.01)
    # A blob read by nodekit's store is touched, and one linked into a project gains a link: either is a use.
    os.utime(blobs / "old")
    time.sleep(0.01)
    os.link(blobs / "new", tmp_path / "linked")
    assert blobs_over_cap(blobs, 1500) == [blobs / "mid", blobs / "old"]
    assert blobs_over_cap(blobs, 3000) == []


def test_older_tags_keep_env_and_the_newest_of_each_repository() -> None:
    rows = [  # docker image ls: newest first
        {"Repository": "nodekit/ddp-demo", "Tag": "c3"},
        {"Repository": "nodekit/ddp-demo", "Tag": "env"},
        {"Repository": "nodekit/ddp-demo", "Tag": "b2"},
        {"Repository": "nodekit/fabric-demo", "Tag": "f1"},
        {"Repository": "nodekit/ddp-demo", "Tag": "a1"},
    ]
    assert older_tags(rows) == ["nodekit/ddp-demo:b2", "nodekit/ddp-demo:a1"]


def test_only_the_tests_repositories_are_touched() -> None:
    ours = [
        "nodekit/ddp-demo",
        "nodekit/cuda-demo",
        "nodekit/nodekit-itest-trixie",
        "nodekit-itest/scratch",
        "nk-sid/test",
    ]
    theirs = ["nodekit/base", "nodekit/myproject", "nodekit/demo-tools", "python", "nodekit"]
    assert [r for r in ours + theirs if is_test_repo(r)] == ours


def test_the_big_test_images_kept_lower_the_room_the_run_needs_until_they_are_removed() -> None:
    rows = [  # docker system df -v --format '{{json .Images}}' (engine 26.1.5's words)
        {"Repository": "nodekit/cuda-demo", "Tag": "7ce9207f7cd2", "Size": "5.95GB", "UniqueSize": "5.776GB"},
        {"Repository": "nodekit/lightlytrain-demo", "Tag": "80a37e875bf2", "Size": "6.81GB", "UniqueSize": "6.634GB"},
        {"Repository": "nodekit/ddp-demo", "Tag": "env", "Size": "1.12GB", "UniqueSize": "173.7kB"},  # not big
        {"Repository": "nodekit/myproject", "Tag": "v1", "Size": "7GB", "UniqueSize": "7GB"},  # not a test image
        {"Repository": "nodekit/cuda-demo", "Tag": "<none>", "Size": "5.9GB", "UniqueSize": "1GB"},  # dangling
    ]
    big = big_images(rows)  # type: ignore[arg-type]
    assert big == {"nodekit/cuda-demo:7ce9207f7cd2": 5.776e9, "nodekit/lightlytrain-demo:80a37e875bf2": 6.634e9}
    free = [30.0]
    room = Room({"default": big, "containerd": {}}, free=lambda: free[0])
    assert room.need_gib() == NEED_GIB - (5.776e9 + 6.634e9) / GIB
    assert not room.short()  # 30 GiB free, and the run builds neither image again: enough
    room.gone("default")  # removed: the run builds them again, and needs the whole room for it
    assert room.need_gib() == NEED_GIB and room.short()


def test_the_groups_kept_data_roots_lower_the_room_and_go_after_every_other_clusters(tmp_path: Path) -> None:
    for name in ["nkb", "nkd", "nku", "nkv", "slurm-images"]:  # a benchmark's, test_ship's, two groups', Slurm's
        (tmp_path / name).mkdir()
    (tmp_path / "nkw").write_text("")  # not a folder: not a cluster's
    idle = idle_roots(tmp_path)
    assert [r.name for r in idle] == ["nkb", "nkd", "nku", "nkv"]
    groups = group_roots(tmp_path)
    assert {r.name for r in groups} == set(CLUSTER_NAMES.values())
    assert [r.name for r in removal_order(idle[::-1], groups)] == ["nkb", "nkd", "nku", "nkv"]
    free = [20.0]
    kept = {tmp_path / "nku": 3.4 * GIB, tmp_path / "nkv": 2.5 * GIB}
    room = Room({"default": {"nodekit/cuda-demo:7ce9207f7cd2": 5.776e9}}, kept, free=lambda: free[0])
    assert room.need_gib() == NEED_GIB - (5.776e9 + 5.9 * GIB) / GIB
    room.root_gone(tmp_path / "nkb")  # not a group's: the need does not change
    assert room.need_gib() == NEED_GIB - (5.776e9 + 5.9 * GIB) / GIB
    room.root_gone(tmp_path / "nku")  # removed: the run ships the demo image to that group's hosts again
    assert room.need_gib() == NEED_GIB - (5.776e9 + 2.5 * GIB) / GIB
    assert kept[tmp_path / "nku"] == 3.4 * GIB  # the caller's dict is the caller's
