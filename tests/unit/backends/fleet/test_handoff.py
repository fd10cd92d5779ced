"""The resume contract when a host is lost, main's included: the hand-off's pure decisions, then a whole mirror
and hand-off through the real transport and node side on this machine (each "host" a unix:// endpoint with its own
output directory, as on three disks): a checkpoint only rank 0's host held reaches every host left."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.backends.fleet import handoff
from nodekit.backends.fleet.hosts import FleetHost, parse_host
from nodekit.config.settings import NodeOverride, Settings
from nodekit.job.spec import output_dir_of
from nodekit.system.progress import RecordingReporter

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_the_newest_version_is_the_one_the_head_saw_last_whatever_the_hosts_clocks() -> None:
    seen = {"h0": {"ckpt.pt": (3, B, 7), "old.pt": (1, A, 1)}, "h1": {"ckpt.pt": (3, A, 2)}}
    assert handoff.newest(seen) == {"ckpt.pt": (3, B), "old.pt": (1, A)}


def test_a_host_gets_what_it_lacks_and_what_the_hand_off_put_there_is_renewed_but_never_its_own_files() -> None:
    latest = {"ckpt.pt": (3, B), "mine.pt": (1, B), "put-before.pt": (1, C), "same.pt": (1, A)}
    have = {"mine.pt": (1, A), "put-before.pt": (1, A), "same.pt": (1, A)}
    todo = handoff.plan_handoff(latest, have, {"put-before.pt": A}, held={A, B, C})
    assert todo == [("ckpt.pt", B, None), ("put-before.pt", C, A)]
    assert handoff.plan_handoff(latest, {}, {}, held={A}) == [("same.pt", A, None)]  # only what the store holds


def _three(tmp_path: Path, **kw: object) -> tuple[Settings, list[FleetHost]]:
    urls = [f"unix://{tmp_path}/h{i}.sock" for i in range(3)]
    nodes = {i: NodeOverride(output_dir=str(tmp_path / f"disk{i}" / "outputs"), iface=f"eth{i}") for i in range(3)}
    s = Settings(project_dir=tmp_path, name="d", script="t.py", hosts=tuple(urls), nnodes=3, nodes=nodes,
                 **({"restarts": 1, "min_nodes": 2} | kw))  # type: ignore[arg-type]  # fmt: skip
    return s, [parse_host(u, i) for i, u in enumerate(urls)]


def test_each_host_keeps_its_own_node_settings_when_the_ranks_are_renumbered(tmp_path: Path) -> None:
    s, hosts = _three(tmp_path, replicate_outputs=False)
    s2, hosts2 = handoff.restart_without(s, hosts, [0], RecordingReporter(), None)
    assert [h.url for h in hosts2] == [hosts[1].url, hosts[2].url] and [h.rank for h in hosts2] == [0, 1]
    assert s2.nodes[0].iface == "eth1" and s2.nodes[1].iface == "eth2" and 2 not in s2.nodes
    assert output_dir_of(s2, 0, tmp_path) == tmp_path / "disk1" / "outputs"


def test_mirroring_is_on_only_when_a_restart_can_go_on_without_a_host(tmp_path: Path) -> None:
    s, hosts = _three(tmp_path)
    assert handoff.replicating(s, hosts)
    assert not handoff.replicating(s.model_copy(update={"min_nodes": None}), hosts)
    assert not handoff.replicating(s.model_copy(update={"restarts": 0}), hosts)
    assert not handoff.replicating(s.model_copy(update={"replicate_outputs": False}), hosts)


def test_a_checkpoint_only_main_held_reaches_every_host_left_after_mains_host_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "MIRROR_S", 3600.0)  # the test runs each round itself
    s, hosts = _three(tmp_path, restarts=2, min_nodes=1)
    disks = [tmp_path / f"disk{i}" / "outputs" for i in range(3)]
    disks[0].mkdir(parents=True)
    (disks[0] / "checkpoint.pt").write_bytes(b"epoch 1")
    (disks[0] / "nodekit").mkdir()
    (disks[0] / "nodekit" / "node-0.log").write_text("a run log stays where it was written")
    disks[2].mkdir(parents=True)
    (disks[2] / "notes.txt").write_text("host 2's own")
    (disks[1] / "x").mkdir(parents=True)
    rep = RecordingReporter()
    with handoff.Keeper(s, hosts, rep) as keeper:
        keeper.round(s, hosts)
        (disks[0] / "checkpoint.pt").write_bytes(b"epoch 2")  # rank 0 saves again; the next round sees it
        keeper.round(s, hosts)
        for f in disks[0].rglob("*"):
            f.unlink() if f.is_file() else None  # main's host is gone: its disk with it
        s2, hosts2 = handoff.restart_without(s, hosts, [0], rep, keeper)
        for d in disks[1:]:
            assert (d / "checkpoint.pt").read_bytes() == b"epoch 2"
            assert not (d / "nodekit").exists()
        assert (disks[2] / "notes.txt").read_text() == "host 2's own"
        assert (disks[1] / "notes.txt").read_text() == "host 2's own"  # what one host had, every host left gets
        # Host 1 (now rank 0) saves a newer checkpoint and changes its copy of notes.txt, then is lost too: host 2's
        # checkpoint, put there by the hand-off, is renewed; its own notes.txt is not touched.
        (disks[1] / "checkpoint.pt").write_bytes(b"epoch 5")
        (disks[1] / "notes.txt").write_text("host 1's edit")
        keeper.round(s2, hosts2)
        handoff.restart_without(s2, hosts2, [0], rep, keeper)
        assert keeper.dir is not None and keeper.dir.is_dir()
    assert (disks[2] / "checkpoint.pt").read_bytes() == b"epoch 5"
    assert (disks[2] / "notes.txt").read_text() == "host 2's own"
    assert keeper.dir is not None and not keeper.dir.exists()  # the mirror is removed with the run
