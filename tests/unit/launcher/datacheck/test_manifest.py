"""The same-data manifest on real directories: equal trees agree, and a difference is named by file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodekit.launcher.datacheck.manifest import digest, first_differences, from_text, manifest, to_text


def _tree(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.bin").write_bytes(b"12345")
    (root / "a" / "y.txt").write_text("hello")
    (root / "z.txt").write_text("zz")
    return root


def test_equal_trees_have_equal_digests_wherever_they_are(tmp_path: Path) -> None:
    one, two = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    for hashes in (False, True):
        m1, m2 = manifest(str(one), hashes=hashes), manifest(str(two), hashes=hashes)
        assert [e.path for e in m1] == ["a/b/x.bin", "a/y.txt", "z.txt"]
        assert digest(m1) == digest(m2)
        assert from_text(to_text(m1)) == m1


def test_a_size_or_a_missing_file_is_named(tmp_path: Path) -> None:
    one, two = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    (two / "a" / "y.txt").write_text("hello!")
    os.remove(two / "z.txt")
    m1, m2 = manifest(str(one)), manifest(str(two))
    assert digest(m1) != digest(m2)
    assert first_differences(m1, m2) == ["a/y.txt: 6 bytes, main has 5", "z.txt: missing"]


def test_same_size_different_content_needs_hashes(tmp_path: Path) -> None:
    one, two = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    (two / "a" / "y.txt").write_text("HELLO")
    assert digest(manifest(str(one))) == digest(manifest(str(two)))  # sizes only: the default, cheap check
    h1, h2 = manifest(str(one), hashes=True), manifest(str(two), hashes=True)
    assert first_differences(h1, h2) == ["a/y.txt: content differs"]


def test_links_are_listed_not_followed(tmp_path: Path) -> None:
    root = _tree(tmp_path / "one")
    (root / "loop").symlink_to(root)
    assert next(e for e in manifest(str(root)) if e.path == "loop").hash == f"->{root}"


def test_a_large_file_is_hashed_in_pieces_and_a_change_in_any_piece_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodekit.launcher.datacheck import manifest as m
    from nodekit.launcher.datacheck.filehash import file_sha256

    monkeypatch.setattr(m, "PIECE", 1000)
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(b"a" * 999)
    big.write_bytes(bytes(range(256)) * 10)  # 2560 bytes: three pieces
    h = m.content_hashes([(str(small), 999), (str(big), 2560)])
    assert h[0] == file_sha256(str(small)) and h[1].startswith("p:")
    data = bytearray(big.read_bytes())
    data[2100] ^= 1
    big.write_bytes(bytes(data))
    assert m.content_hashes([(str(big), 2560)])[0] != h[1]


def test_the_one_file_hash_helper_hashes_and_copies_the_same_bytes(tmp_path: Path) -> None:
    import hashlib
    import io

    from nodekit.launcher.datacheck.filehash import CHUNK, file_sha256

    empty, big = tmp_path / "empty", tmp_path / "big.bin"
    empty.write_bytes(b"")
    data = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # two chunks and a bit
    big.write_bytes(data)
    assert file_sha256(empty) == hashlib.sha256(b"").hexdigest()
    copy = io.BytesIO()
    assert file_sha256(big, copy_to=copy) == hashlib.sha256(data).hexdigest() == file_sha256(str(big))
    assert copy.getvalue() == data
    with pytest.raises(OSError):
        file_sha256(tmp_path / "missing")


def test_the_state_a_dataset_push_keeps_beside_the_data_is_not_data(tmp_path: Path) -> None:
    one, two = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    (two / ".nodekit-data").mkdir()
    (two / ".nodekit-data" / "state.json").write_text("{}")  # differs per node by design (inodes, times)
    (two / "a" / ".nodekit-data").mkdir()  # only the top-level one is nodekit's
    (two / "a" / ".nodekit-data" / "x").write_text("data")
    (one / "a" / ".nodekit-data").mkdir()
    (one / "a" / ".nodekit-data" / "x").write_text("data")
    assert digest(manifest(str(one), hashes=True)) == digest(manifest(str(two), hashes=True))


def test_many_small_files_go_to_the_hashing_threads_in_batches_and_a_big_ones_pieces_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-off to a thread per small file costs about as much as hashing it: small files travel in batches, and
    the hashes are those of each file whatever batch it was in."""
    from concurrent.futures import ThreadPoolExecutor

    from nodekit.launcher.datacheck import manifest as m
    from nodekit.launcher.datacheck.filehash import file_sha256

    handed: list[int] = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            handed.append(1)
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(m, "ThreadPoolExecutor", Counting)
    monkeypatch.setattr(m, "PIECE", 1000)
    files = []
    for i in range(600):
        p = tmp_path / f"{i:03d}.bin"
        p.write_bytes(os.urandom(i % 50))
        files.append((str(p), i % 50))
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(4500))  # five pieces
    hashes = m.content_hashes([*files[:300], (str(big), 4500), *files[300:]])
    assert len(handed) <= 5 + 2 + 600 // 16
    assert hashes[:300] + hashes[301:] == [file_sha256(p) for p, _ in files]
    assert hashes[300] == m.content_hashes([(str(big), 4500)])[0]


def test_a_mount_of_one_file_is_its_own_manifest(tmp_path: Path) -> None:
    """``check`` on a mount whose host path is one file (a ``source`` that is one file): the file's name, size and
    content hash, as it would be listed inside a directory."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "tokens.json").write_bytes(b"{}" * 1000)
    inside = manifest(str(tmp_path / "d"), hashes=True)
    assert manifest(str(tmp_path / "d" / "tokens.json"), hashes=True) == inside
    assert manifest(str(tmp_path / "d" / "tokens.json")) == manifest(str(tmp_path / "d"))
