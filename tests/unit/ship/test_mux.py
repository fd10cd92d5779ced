"""nodekit/ship/mux.py: a push killed with SIGKILL cannot remove its connection directory; the next one does."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from nodekit.ship import mux

SSH = shutil.which("ssh")  # OpenSSH's client: every fleet command needs it, and `make test` has it


def test_a_push_killed_with_sigkill_leaves_its_directory_and_the_next_push_removes_it() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom nodekit.ship import mux\nwith mux.SharedSsh() as s:\n"
         "    print(s.dir, flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    left = Path(child.stdout.readline().strip())
    assert left.name.startswith(f"nkssh.{child.pid}.") and (left / "ssh").is_file()
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert left.is_dir()  # nothing ran on the way out
    with mux.SharedSsh() as shared:
        assert shared.dir is not None and shared.dir.name.startswith(f"nkssh.{os.getpid()}.")
        assert not left.exists()
    assert not shared.dir


def test_the_sweep_removes_only_this_users_directories_of_dead_processes(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f"nkssh.{dead.pid}.abc"
    left.mkdir()
    (left / "ssh").write_text("#!/bin/sh\n")
    control = socket.socket(socket.AF_UNIX)
    control.bind(str(left / "c0ffee"))  # a master's socket whose master is gone
    control.close()
    kept = [tmp_path / f"nkssh.{os.getppid()}.def", tmp_path / f"nkssh.{os.getpid()}.ghi", tmp_path / "nkssh.x.y"]
    for d in kept:
        d.mkdir()
    (tmp_path / f"nkssh.{dead.pid}.file").write_text("not a directory")
    assert SSH is not None
    assert mux.sweep(tmp_path, SSH) == [left]
    assert not left.exists() and all(d.is_dir() for d in kept)
    assert (tmp_path / f"nkssh.{dead.pid}.file").is_file()
