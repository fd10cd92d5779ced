"""The manifest and its hash cache on real files: an unchanged file is never read again, a changed one always is
(size, mtime or inode), and a source that holds what cannot be sent is refused by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodekit.launcher.datacheck.manifest import content_hashes, manifest
from nodekit.launcher.datasync import scan
from nodekit.launcher.datasync.names import name_problem


def _tree(root: Path) -> Path:
    (root / "d").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 1000)
    (root / "d" / "b.txt").write_text("bee")
    return root


def _read_counter(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    read: list[str] = []

    def counting(files: list[tuple[str, int]], threads: int = 4) -> list[str]:
        read.extend(os.path.basename(p) for p, _ in files)
        return content_hashes(files, threads)

    monkeypatch.setattr(scan, "content_hashes", counting)
    return read


def test_the_manifest_is_the_datacheck_hash_and_unchanged_files_are_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "src")
    read = _read_counter(monkeypatch)
    files, problems = scan.source_files(str(root))
    first, cache = scan.hashed(str(root), files, {})
    assert problems == [] and sorted(read) == ["a.bin", "b.txt"]
    assert first == {e.path: (e.size, e.hash) for e in manifest(str(root), hashes=True)}
    read.clear()
    again, _ = scan.hashed(str(root), scan.source_files(str(root))[0], cache)
    assert again == first and read == []


def test_a_change_to_size_mtime_or_inode_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "src")
    _, cache = scan.hashed(str(root), scan.source_files(str(root))[0], {})
    read = _read_counter(monkeypatch)
    a = root / "a.bin"
    st = a.stat()
    a.write_bytes(b"b" * 1000)  # same size: the time tells
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    m, cache = scan.hashed(str(root), scan.source_files(str(root))[0], cache)
    assert read == ["a.bin"] and m["a.bin"][1] == content_hashes([(str(a), 1000)])[0]
    read.clear()
    (root / "new").write_bytes(b"b" * 1000)
    os.replace(root / "new", a)  # another inode
    os.utime(a, ns=(a.stat().st_atime_ns, cache["a.bin"][1]))  # type: ignore[arg-type]
    scan.hashed(str(root), scan.source_files(str(root))[0], cache)
    assert read == ["a.bin"]


def test_links_inside_are_sent_as_files_anything_else_is_refused_by_name(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    (tmp_path / "outside").write_text("secret")
    (root / "in-link").symlink_to("a.bin")
    (root / "out-link").symlink_to(tmp_path / "outside")
    (root / "dir-link").symlink_to("d")
    (root / "dangling").symlink_to("nowhere")
    os.mkfifo(root / "fifo")
    (root / os.fsdecode(b"bad-\xff")).write_text("x")
    files, problems = scan.source_files(str(root))
    assert [n for n, _ in files] == ["a.bin", "d/b.txt", "in-link"]
    assert any(p.startswith("out-link is a link out of the source") for p in problems), problems
    assert "dir-link is a link to a directory or special file" in problems
    assert "dangling is a link to nothing" in problems
    assert "fifo is not a regular file (a device, FIFO or socket)" in problems
    assert any("is not valid UTF-8" in p for p in problems), problems


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a//b",
        "./a",
        "a/.",
        ".nodekit-data/state.json",
        "a\x00b",
        os.fsdecode(b"\xff"),
    ],
)
def test_names_that_could_leave_the_target_are_problems(name: str) -> None:
    assert name_problem(name) is not None


def test_plain_names_pass() -> None:
    assert name_problem("train/shard-0001.tar") is None
    assert name_problem("日本/データ.parquet") is None
    assert name_problem("x/.nodekit-data") is None  # only the top-level one is nodekit's
