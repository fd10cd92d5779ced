"""write_atomic: the whole file or the old one, never half; modes kept, never through a symbolic link, the
directory synced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodekit.errors import UsageError
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
def test_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path: Path, relative: bool) -> None:
    """A cloned repository commits compose/node-0.yaml -> ~/.ssh/authorized_keys: the link is refused, not written
    through, and neither it nor its target changes."""
    real = tmp_path / "home" / "authorized_keys"
    real.parent.mkdir()
    real.write_text("the user's key\n")
    link = tmp_path / "project" / "compose" / "node-0.yaml"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(real, link.parent) if relative else real)
    with pytest.raises(UsageError) as refused:
        write_atomic(link, "new\n", within=tmp_path / "project")
    assert str(link) in refused.value.one_line() and f"rm {link}" in (refused.value.fix or "")
    assert "\n" not in refused.value.one_line()
    assert link.is_symlink() and real.read_text() == "the user's key\n"
    assert sorted(p.name for p in link.parent.iterdir()) == ["node-0.yaml"]  # no temporary file left


def test_a_dangling_link_is_refused_and_nothing_is_made_where_it_points(tmp_path: Path) -> None:
    link = tmp_path / "node-0.yaml"
    link.symlink_to(tmp_path / "target.yaml")
    with pytest.raises(UsageError):
        write_atomic(link, "x\n")
    assert link.is_symlink() and not (tmp_path / "target.yaml").exists()


@pytest.mark.parametrize("where", ["compose", "compose/sub"])
def test_a_directory_below_the_project_that_is_a_link_is_refused(tmp_path: Path, where: str) -> None:
    """compose/ (or a directory under it) committed as a link to ~/.ssh: nothing is written there, and the
    refusal names the link."""
    outside = tmp_path / "home" / ".ssh"
    outside.mkdir(parents=True)
    (outside / "node-0.yaml").write_text("the user's\n")
    project = tmp_path / "project"
    (project / "compose").mkdir(parents=True)
    link = project / where
    if where == "compose":
        link.rmdir()
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UsageError) as refused:
        write_atomic(
            project / "compose" / "sub" / "node-0.yaml" if where != "compose" else link / "node-0.yaml",
            "x\n",
            within=project,
        )
    assert f"{link} is a symbolic link" in refused.value.one_line()
    assert sorted(p.name for p in outside.iterdir()) == ["node-0.yaml"]
    assert (outside / "node-0.yaml").read_text() == "the user's\n"


def test_the_project_and_directories_above_it_may_be_links(tmp_path: Path) -> None:
    """A home directory or a checkout reached through a link is the user's own doing: only what lies below
    ``within`` is held to no links, and a ``path`` outside ``within`` only in its last name."""
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real", target_is_directory=True)
    write_atomic(tmp_path / "via" / "compose" / "node-0.yaml", "x\n", within=tmp_path / "via")
    assert (tmp_path / "real" / "compose" / "node-0.yaml").read_text() == "x\n"
    write_atomic(tmp_path / "via" / "out" / "job.sbatch", "y\n", within=tmp_path / "elsewhere")
    assert (tmp_path / "real" / "out" / "job.sbatch").read_text() == "y\n"


def test_a_link_planted_as_the_temporary_name_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file is made exclusively and without following a link: a link guessed in advance at its name
    is skipped, never written through."""
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr("nodekit.system.files.secrets.token_hex", lambda n: next(names))
    (tmp_path / ".f.yaml.aaaa.tmp").symlink_to(victim)
    write_atomic(tmp_path / "f.yaml", "x\n")
    assert victim.read_text() == "kept\n" and (tmp_path / "f.yaml").read_text() == "x\n"


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

    def broken(src: str, dst: str, **dir_fds: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_atomic(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["f.yaml"]


def test_a_private_file_is_made_once_0600_and_what_it_holds_is_the_caller_s_to_judge(tmp_path: Path) -> None:
    """private_once: made whole by the first writer and returned as it stands after that; a file others may know is
    refused with its path, for the caller to word."""
    from nodekit.system.files import PrivateFileRefused, private_once, read_private

    path = tmp_path / "state" / "token"
    assert read_private(path) is None
    assert private_once(path, lambda: "first") == "first"
    assert private_once(path, lambda: "second") == "first\n" and mode(path) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"]
    path.write_text("")
    assert private_once(path, lambda: "third") == "third\n"
    path.chmod(0o644)
    with pytest.raises(PrivateFileRefused) as e:
        read_private(path)
    assert (e.value.path, e.value.kind, e.value.why) == (path, "known", "readable by others (mode 0644)")
