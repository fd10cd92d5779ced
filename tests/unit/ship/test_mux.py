"""nodekit/ship/mux.py: a push killed with SIGKILL cannot remove its connection directory; the next one does."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
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


SSHD = Path("/usr/sbin/sshd")


def _master(tmp_path: Path, d: Path) -> Path:
    """A real connection's master in ``d`` (OpenSSH's client with the options nodekit's wrapper gives it, to Debian's
    sshd in inetd mode on the other end of its ProxyCommand: no port, no network), opened by ``ssh HOST true`` as
    remote.opening opens one; returns its control socket."""
    if not SSHD.is_file() or SSH is None or os.getuid() != 0:
        from tests.conftest import unavailable

        unavailable("the real-sshd test", "it needs root, OpenSSH's client and sshd (make sshd)")
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / key)], check=True)
    (tmp_path / "sshd_config").write_text(
        f"HostKey {tmp_path / 'host'}\nAuthorizedKeysFile {tmp_path / 'client.pub'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPidFile none\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    own = ["-F", "/dev/null", "-i", str(tmp_path / "client"), "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", f"ProxyCommand={SSHD} -i -f {tmp_path / 'sshd_config'}"]  # fmt: skip
    from nodekit.system import ssh

    subprocess.run([SSH, *own, *ssh.shared(str(d), mux.PERSIST_S), "root@node", "true"], check=True, timeout=30)
    (sock,) = [p for p in d.iterdir() if p.is_socket()]
    return sock


def test_a_runs_end_ends_each_master_without_a_process_per_host(tmp_path: Path) -> None:
    """The run's end ends every host's master. `ssh -O exit` per host was a process start per host: at 64 stand-in
    hosts, 64 of them at once were the head's memory peak (docs/scale.md). A master's process is found by its title,
    which names its socket, and sent SIGTERM; no `ssh -O exit` runs."""
    d = Path(tempfile.mkdtemp(prefix="nkssh.1.", dir="/tmp"))  # short: a socket's path is at most 107 bytes
    pid = 0
    try:
        sock = _master(tmp_path, d)
        (pid,) = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline") if _title(p) == f"ssh: {sock} [mux]"]
        fake = tmp_path / "ssh-O"
        fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "asked"}\n')
        fake.chmod(0o755)
        assert mux.close_masters(d, str(fake)) == 1
        deadline = time.monotonic() + 10
        while (sock.exists() or _running(pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not sock.exists() and not _running(pid)
        assert not (tmp_path / "asked").exists()  # no `ssh -O exit` was started
    finally:
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)  # the master this test started
        shutil.rmtree(d, ignore_errors=True)


def _title(cmdline: Path) -> str:
    try:
        return cmdline.read_bytes().split(b"\0", 1)[0].decode(errors="replace").strip()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: init reaps the master, not this test)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
