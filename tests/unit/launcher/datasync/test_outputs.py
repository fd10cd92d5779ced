"""The node side of an output directory (``put`` for the restart hand-off, ``list``): a request naming a path
outside, or through a link, is refused whole before anything is written; a file the job wrote is never
overwritten; a damaged content is never placed."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from nodekit.launcher.datasync import outputs
from nodekit.launcher.datasync.receive import REFUSED


def _stream(files: list[tuple[str, bytes, str | None]], *, damage: bool = False) -> io.BytesIO:
    entries = [[n, len(b), hashlib.sha256(b).hexdigest(), r] for n, b, r in files]
    head = json.dumps({"files": entries}).encode()
    body = b"".join(f"{len(b)}\n".encode() + (b[:-1] + b"X" if damage else b) for _, b, _ in files)
    return io.BytesIO(f"{len(head)}\n".encode() + head + body)


def _put(root: Path, stream: io.BytesIO) -> tuple[int, dict[str, object]]:
    out = io.StringIO()
    code = outputs.main(["put", str(root)], stream, out)
    return code, json.loads(out.getvalue()) if out.getvalue() else {}


def test_put_places_new_files_and_never_overwrites_the_jobs_own(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("the job's")
    code, answer = _put(tmp_path, _stream([("ckpt/a.pt", b"weights", None), ("mine.txt", b"other", None)]))
    assert code == 0 and answer["placed"] == ["ckpt/a.pt"], answer
    assert (tmp_path / "ckpt" / "a.pt").read_bytes() == b"weights"
    assert (tmp_path / "mine.txt").read_text() == "the job's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "mine.txt"]  # no staging left


def test_put_replaces_a_file_only_when_it_holds_the_named_content(tmp_path: Path) -> None:
    (tmp_path / "a.pt").write_bytes(b"old")
    old = hashlib.sha256(b"old").hexdigest()
    code, answer = _put(tmp_path, _stream([("a.pt", b"new", old)]))
    assert code == 0 and answer["placed"] == ["a.pt"]
    assert (tmp_path / "a.pt").read_bytes() == b"new"
    code, answer = _put(tmp_path, _stream([("a.pt", b"newer", old)]))  # it no longer holds "old"
    assert answer["placed"] == [] and (tmp_path / "a.pt").read_bytes() == b"new"


def test_a_damaged_content_is_not_placed(tmp_path: Path) -> None:
    code, answer = _put(tmp_path, _stream([("a.pt", b"weights", None)], damage=True))
    assert code == 0 and answer["placed"] == [] and not (tmp_path / "a.pt").exists()


@pytest.mark.parametrize("name", ["../escape", "/tmp/x", "a/./b", ".nodekit-data/state.json"])
def test_a_name_outside_refuses_the_whole_request(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    code, _ = _put(root, _stream([("fine.pt", b"x", None), (name, b"y", None)]))
    assert code == REFUSED
    assert list(root.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["root"]


def test_a_parent_that_is_a_link_refuses_the_whole_request(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "ckpt").symlink_to(elsewhere)
    code, _ = _put(root, _stream([("ckpt/a.pt", b"x", None)]))
    assert code == REFUSED and list(elsewhere.iterdir()) == []


def test_listing_leaves_out_links_and_excluded_directories(tmp_path: Path) -> None:
    (tmp_path / "nodekit").mkdir()
    (tmp_path / "nodekit" / "node-0.log").write_text("log")
    (tmp_path / "a.pt").write_bytes(b"x")
    os.symlink("/etc/passwd", tmp_path / "leak")
    found = outputs.listing(str(tmp_path), {}, ["nodekit"])
    assert list(found["files"]) == ["a.pt"] and found["skipped"] == ["leak is a link or a special file"]
