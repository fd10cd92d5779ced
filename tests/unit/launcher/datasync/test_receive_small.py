"""Many small contents in one stream (a dataset of 20,000 images): each lands proven and only once the whole stream is
in, one damaged content keeps every file out of place, and the state the push ends with trusts the hashes it made
while writing (the files are not read again)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodekit.launcher.datasync import node, scan
from nodekit.launcher.datasync.node import load_state, staging_dir
from tests.unit.launcher.datasync.streams import plan_for, run, sha, snapshot, stream

FILES = {f"shards/d{i % 4}/{i:04d}.jpg": os.urandom(2000 + 37 * i) for i in range(300)}


@pytest.fixture
def target(tmp_path: Path) -> Path:
    t = tmp_path / "target"
    t.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("keep")
    return t


def test_many_small_contents_land_proven_and_the_state_keeps_the_hashes_made_while_writing(
    target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reread(*_: object) -> list[str]:
        raise AssertionError("a file the push just wrote and hashed was read again")

    monkeypatch.setattr(scan, "content_hashes", reread)
    assert run(target, stream(plan_for(FILES), [(sha(d), d) for d in FILES.values()])) == 0
    assert {n: (target / n).read_bytes() for n in FILES} == FILES
    assert not os.path.exists(staging_dir(str(target)))
    state = load_state(str(target))
    assert set(state) == set(FILES)
    for name, entry in state.items():  # what the next scan trusts without reading: size, mtime, inode, hash
        st = os.lstat(target / name)
        assert entry == [st.st_size, st.st_mtime_ns, st.st_ino, sha(FILES[name])]
    monkeypatch.undo()
    assert node.verify(str(target), {n: (len(d), sha(d)) for n, d in FILES.items()})["ok"]


def test_one_damaged_small_content_among_many_keeps_every_file_out_of_place(target: Path) -> None:
    before = snapshot(target.parent / "outside")
    damaged = "shards/d1/0149.jpg"
    sent = [(sha(d), d if n != damaged else d[:-1] + bytes([d[-1] ^ 1])) for n, d in FILES.items()]
    assert run(target, stream(plan_for(FILES), sent)) == 5  # frames.BROKEN
    assert not (target / "shards").exists()  # not one of the 300, though 299 arrived whole
    stage = staging_dir(str(target))
    # What arrived whole stays staged, under the hash it was proven to have, for the next push; the damaged one not.
    assert sorted(os.listdir(stage)) == sorted(sha(d).replace(":", "_") for n, d in FILES.items() if n != damaged)
    assert all(sha((Path(stage) / n).read_bytes()) == n for n in os.listdir(stage))
    assert snapshot(target.parent / "outside") == before


def test_a_small_content_is_created_as_open_would_with_the_umask(target: Path) -> None:
    old = os.umask(0o027)
    try:
        assert run(target, stream(plan_for({"a.jpg": b"x" * 100}), [(sha(b"x" * 100), b"x" * 100)])) == 0
    finally:
        os.umask(old)
    assert os.stat(target / "a.jpg").st_mode & 0o777 == 0o640
