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


# A stand-in ssh for `ssh -O exit`: it notes how many are in flight beside it (each one a file while it runs), holds on
# until a second one has started or 3 s pass, then ends.
SLOW_EXIT = r"""#!/bin/sh
me="$HERE/inflight.$$"; touch "$me"
n=0; while [ "$(ls "$HERE" | grep -c '^inflight\.')" -lt 2 ] && [ "$n" -lt 30 ]; do sleep 0.1; n=$((n + 1)); done
ls "$HERE" | grep -c '^inflight\.' >> "$HERE/seen"
rm -f "$me"
"""


def test_the_masters_of_a_run_are_told_to_exit_side_by_side_not_one_after_another(tmp_path: Path) -> None:
    """A run's end tells each host's master to exit; one after another that was a process start per host in a row,
    100 s of the head's end at 256 stand-in hosts (benchmarks/scale_bench.py)."""
    d = tmp_path / "nkssh.1.x"
    d.mkdir()
    for i in range(4):
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(d / f"m{i}"))
        s.close()
    fake = tmp_path / "ssh"
    fake.write_text(SLOW_EXIT)
    fake.chmod(0o755)
    here = tmp_path / "here"
    here.mkdir()
    from nodekit.system import proc

    with proc.extra_env({"HERE": str(here)}):
        assert mux.close_masters(d, str(fake)) == 4
    seen = [int(x) for x in (here / "seen").read_text().split()]
    assert len(seen) == 4 and max(seen) >= 2, seen
