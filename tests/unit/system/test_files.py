"""write_atomic: the whole file or the old one, never half; modes kept, symbolic links written through, the
directory synced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodekit.system.files import write_atomic


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_mode_asked_for(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a" / "new.yaml", "x\n", mode=0o600)
    assert mode(tmp_path / "a" / "new.yaml") == 0o600
    write_atomic(tmp_path / "plain.yaml", "x\n")
    assert mode(tmp_path / "plain.yaml") == 0o644


def test_an_existing_file_keeps_a_stricter_mode(tmp_path: Path) -> None:
    path = tmp_path / "node-0.yaml"
    path.write_text("old\n")
    path.chmod(0o600)
    write_atomic(path, "new\n")  # the default 0644 must not open a 0600 file (it may hold the job secret)
    assert (path.read_text(), mode(path)) == ("new\n", 0o600)
    path.chmod(0o640)
    write_atomic(path, "newer\n")
    assert mode(path) == 0o640
    path.chmod(0o644)
    write_atomic(path, "secret\n", mode=0o600)  # and a file that now holds a secret is closed to others
    assert mode(path) == 0o600


@pytest.mark.parametrize("relative", [True, False])
def test_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path: Path, relative: bool) -> None:
    real = tmp_path / "elsewhere" / "node-0.yaml"
    real.parent.mkdir()
    real.write_text("old\n")
    real.chmod(0o600)
    link = tmp_path / "compose" / "node-0.yaml"
    link.parent.mkdir()
    link.symlink_to(os.path.relpath(real, link.parent) if relative else real)
    write_atomic(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n" and mode(real) == 0o600
    assert sorted(p.name for p in real.parent.iterdir()) == ["node-0.yaml"]  # no temporary file left
    assert sorted(p.name for p in link.parent.iterdir()) == ["node-0.yaml"]


def test_a_dangling_link_gets_its_target(tmp_path: Path) -> None:
    link = tmp_path / "node-0.yaml"
    link.symlink_to(tmp_path / "target.yaml")
    write_atomic(link, "x\n")
    assert link.is_symlink() and (tmp_path / "target.yaml").read_text() == "x\n"


def test_the_directory_is_synced_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "f.yaml", "x\n")
    assert synced == ["file", "dir"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("old\n")

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["f.yaml"]
