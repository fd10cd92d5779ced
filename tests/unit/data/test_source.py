"""The source's manifest and its hash cache in the project: a dataset that did not change costs a walk and a stat
per file, neither a read of its files nor a rewrite of the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodekit.data import source
from nodekit.launcher.datasync import scan


def test_an_unchanged_source_is_neither_read_again_nor_its_cache_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    (data / "d").mkdir(parents=True)
    for i in range(50):
        (data / "d" / f"{i:02d}.bin").write_bytes(os.urandom(100 + i))
    first, _ = source.manifest(tmp_path, data, mount="/data")
    (cache,) = (tmp_path / source.CACHE_DIR).iterdir()
    before = cache.stat()
    read: list[int] = []
    real = scan.content_hashes
    monkeypatch.setattr(scan, "content_hashes", lambda files, *a: read.append(len(files)) or real(files, *a))
    again, _ = source.manifest(tmp_path, data, mount="/data")
    assert again == first and read == []
    after = cache.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    (data / "d" / "07.bin").write_bytes(b"changed")
    changed, _ = source.manifest(tmp_path, data, mount="/data")
    assert read == [1] and changed["d/07.bin"][0] == 7
    assert cache.stat().st_ino != before.st_ino  # the new hash is kept for the next push
