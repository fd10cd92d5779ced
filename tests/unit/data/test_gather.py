"""`nodekit data gather` through the real transport and the real node side (this machine's python3 runs it, as a
host's does over SSH): per-node directories, identical files stored once, verified, resumable, hostile names refused,
nothing written outside the destination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.data import gather as g
from nodekit.data.outputs import checked_listing
from nodekit.data.transport import DataError, Where

runner = CliRunner()


def _nodes(tmp_path: Path) -> list[Path]:
    roots = [tmp_path / f"host{i}" / "outputs" for i in range(2)]
    shared = os.urandom(3 << 20)
    for i, r in enumerate(roots):
        (r / "ckpt").mkdir(parents=True)
        (r / "ckpt" / "model.pt").write_bytes(shared)  # the same on both: stored once
        (r / "log.txt").write_text(f"node {i}\n")
    (roots[0] / "only-0.bin").write_bytes(os.urandom(5000))
    return roots


def _sources(roots: list[Path]) -> list[g.Source]:
    return [g.Source(Where(f"node {i}"), str(r), f"node-{i}") for i, r in enumerate(roots)]


def test_each_node_lands_in_its_own_directory_with_identical_files_stored_once(tmp_path: Path) -> None:
    roots, dest = _nodes(tmp_path), tmp_path / "gathered"
    plans = g.plan_all(_sources(roots), dest)
    assert sum(len(p.fetch) for p in plans) == 4  # model.pt travels once, from node 0
    done = g.gather(plans, dest)
    assert [d.placed for d in done] == [3, 2]
    for i, r in enumerate(roots):
        for f in r.rglob("*"):
            if f.is_file():
                assert (dest / f"node-{i}" / f.relative_to(r)).read_bytes() == f.read_bytes()
    a, b = dest / "node-0" / "ckpt" / "model.pt", dest / "node-1" / "ckpt" / "model.pt"
    assert a.stat().st_ino == b.stat().st_ino  # one copy on disk
    assert (dest / "node-1" / "log.txt").read_text() == "node 1\n"
    # Again: nothing travels, every name is still there.
    again = g.plan_all(_sources(roots), dest)
    assert sum(p.fetch_bytes for p in again) == 0
    assert [d.placed for d in g.gather(again, dest)] == [3, 2]


def test_a_gather_cut_short_fetches_only_the_rest_next_time(tmp_path: Path) -> None:
    roots, dest = _nodes(tmp_path), tmp_path / "gathered"
    plans = g.plan_all(_sources(roots), dest)
    g.gather(plans[:1], dest)  # as if node 1's stream had been cut
    plans = g.plan_all(_sources(roots), dest)
    assert [len(p.fetch) for p in plans] == [0, 1]  # node 1's log only: model.pt is in the store already
    g.gather(plans, dest)
    assert (dest / "node-1" / "log.txt").read_text() == "node 1\n"


def test_a_file_changed_after_the_listing_is_not_kept(tmp_path: Path) -> None:
    roots, dest = _nodes(tmp_path), tmp_path / "gathered"
    plans = g.plan_all(_sources(roots), dest)
    (roots[0] / "only-0.bin").write_bytes(os.urandom(5000))  # same size, other bytes: the hash tells
    done = g.gather(plans, dest)
    assert done[0].missed == ("only-0.bin",)
    assert not (dest / "node-0" / "only-0.bin").exists()
    assert not list((dest / g.STATE / "objects").glob(".*"))  # no half-written content left


def test_the_dry_run_writes_nothing(tmp_path: Path) -> None:
    roots, dest = _nodes(tmp_path), tmp_path / "gathered"
    text = g.dry_run_text(g.plan_all(_sources(roots), dest), dest)
    assert "fetch 3 " in text and "would fetch" in text
    assert not dest.exists()


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", "a//b", ".nodekit-data/x"])
def test_a_node_that_names_a_path_outside_is_refused_whole(name: str) -> None:
    answer = {"files": {"fine.txt": [1, 1, 1, "a" * 64], name: [1, 1, 1, "b" * 64]}}
    with pytest.raises(DataError, match="offered a file nodekit refuses"):
        checked_listing(answer, where="node 1")


def test_a_bad_hash_from_a_node_is_refused() -> None:
    with pytest.raises(DataError, match="not a content hash"):
        checked_listing({"files": {"x": [1, 1, 1, "../../x"]}}, where="node 1")


def test_links_on_the_node_are_not_followed(tmp_path: Path) -> None:
    roots, dest = _nodes(tmp_path), tmp_path / "gathered"
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    (roots[0] / "leak").symlink_to(secret)
    plans = g.plan_all(_sources(roots), dest)
    assert "leak" not in plans[0].files and any("leak" in s for s in plans[0].skipped)


def test_a_link_in_the_destination_is_refused_not_written_through(tmp_path: Path) -> None:
    roots, dest = _nodes(tmp_path), tmp_path / "gathered"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest.mkdir()
    (dest / "node-0").symlink_to(elsewhere)
    with pytest.raises(DataError, match="is a link or a file"):
        g.gather(g.plan_all(_sources(roots), dest), dest)
    assert list(elsewhere.iterdir()) == []


def test_the_command_gathers_a_hosts_output_dir_and_refuses_a_path_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS", "NODEKIT_OUTPUT_DIR"):
        monkeypatch.delenv(var, raising=False)
    on_host = tmp_path / "disk-of-node-0"
    (on_host / "ckpt").mkdir(parents=True)
    (on_host / "ckpt" / "last.pt").write_bytes(b"weights")
    (tmp_path / "nodekit.toml").write_text(
        'name = "gathertest"\nscript = "train.py"\nnnodes = 1\nhosts = ["unix:///var/run/docker.sock"]\n\n'
        f'[nodes.0]\noutput_dir = "{on_host}"\n'
    )
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["data", "gather", "--path", "ckpt"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "gathered" / "node-0" / "last.pt").read_bytes() == b"weights"
    result = runner.invoke(app, ["data", "gather", "--path", "../etc"])
    assert result.exit_code == 2 and "--path" in result.output, result.output
