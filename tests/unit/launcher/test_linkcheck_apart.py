"""The link check's listener and transfers in a process of their own (``linkcheck/apart.py``): a real child
process, real sockets on loopback, the real handshake with the job secret."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodekit.launcher.linkcheck.apart import Apart, Here, ListenError
from tests.factories import gone

SECRET = "job-secret-for-the-apart-check"
RUN = b"r" * 16


def _listening_inode(port: int) -> str:
    """The inode of the socket listening on ``port`` (IPv4), from /proc/net/tcp."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    raise AssertionError(f"nothing listens on {port}")


def _socket_inodes(pid: int | str) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:[") : -1])
    return out


def test_the_listener_is_the_childs_the_secret_never_in_its_arguments_and_closing_ends_it() -> None:
    a, b = Apart(SECRET, RUN, "127.0.0.1"), Apart(SECRET, RUN, "127.0.0.2")
    try:
        for m in (a, b):
            inode = _listening_inode(m.port)
            assert inode in _socket_inodes(m.pid) and inode not in _socket_inodes("self")
            assert SECRET.encode() not in Path(f"/proc/{m.pid}/cmdline").read_bytes()
            assert SECRET.encode() not in Path(f"/proc/{m.pid}/environ").read_bytes()
        pair = a.measure(0, 1, "127.0.0.2", b.port, 0.05, "127.0.0.1")
        assert pair.error == "" and pair.ab.gbit and pair.ba.gbit and pair.rtt_ms is not None, pair
        assert (pair.a, pair.b) == (0, 1)
    finally:
        a.close()
        b.close()
    assert gone(a.pid, 5) and gone(b.pid, 5)
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.2", b.port))


def test_a_partner_without_the_secret_is_a_pair_with_its_error_and_the_child_goes_on() -> None:
    a, stranger = Apart(SECRET, RUN, "127.0.0.1"), Apart("another-secret", RUN, "127.0.0.3")
    b = Here(SECRET, RUN, "127.0.0.2")
    try:
        refused = a.measure(0, 1, "127.0.0.3", stranger.port, 0.05, "127.0.0.1")
        assert refused.error and refused.gbit is None
        fine = a.measure(0, 2, "127.0.0.2", b.port, 0.05, "127.0.0.1")  # the same child measures the next pair
        assert fine.error == "" and fine.gbit, fine
    finally:
        a.close()
        stranger.close()
        b.close()


def test_an_address_not_this_machines_is_one_line_and_no_child_is_left() -> None:
    before = {p.name for p in Path("/proc").iterdir() if p.name.isdigit()}
    with pytest.raises(ListenError, match="assign requested address"):
        Apart(SECRET, RUN, "192.0.2.1")  # TEST-NET-1: no interface here holds it
    time.sleep(0.2)
    mine = str(os.getpid())
    left = [
        p.name
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and p.name not in before and _parent(p.name) == mine and not gone(int(p.name), 0.1)
    ]
    assert left == []


def _parent(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1]
    except OSError:
        return ""


LAUNCHER = """
import sys, time
from nodekit.launcher.linkcheck.apart import Apart
m = Apart(sys.argv[1], b"r" * 16, "127.0.0.1")
print(m.pid, m.port, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_child_ends_when_the_launcher_ends_however_it_ends(how: signal.Signals) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, SECRET], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pid, port = (int(x) for x in launcher.stdout.readline().split())
        assert _listening_inode(port) in _socket_inodes(pid)
        launcher.send_signal(how)
        launcher.wait(10)
        assert gone(pid, 5), f"the check's process {pid} outlived its launcher ({how.name})"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_child_that_died_makes_its_pairs_errors_naming_it_not_a_hang() -> None:
    a, b = Apart(SECRET, RUN, "127.0.0.1"), Here(SECRET, RUN, "127.0.0.2")
    try:
        os.kill(a.pid, signal.SIGKILL)
        t0 = time.monotonic()
        pair = a.measure(0, 1, "127.0.0.2", b.port, 0.05, "127.0.0.1")
        assert time.monotonic() - t0 < 5
        assert pair.gbit is None and "link check process" in pair.error and "ended (exit code -9)" in pair.error, pair
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("how", ["working directory", "PYTHONPATH"])
def test_the_jobs_files_do_not_shadow_the_childs_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    for name in ("select", "json", "secrets"):  # a job's own modules that share a name with the standard library's
        (tmp_path / f"{name}.py").write_text("raise SystemExit('the job file was imported')\n")
    if how == "PYTHONPATH":  # as an image with ENV PYTHONPATH=/workspace has it
        monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    else:
        monkeypatch.chdir(tmp_path)
    a, b = Apart(SECRET, RUN, "127.0.0.1"), Here(SECRET, RUN, "127.0.0.2")
    try:
        pair = a.measure(0, 1, "127.0.0.2", b.port, 0.05, "127.0.0.1")
        assert pair.error == "" and pair.gbit, pair
    finally:
        a.close()
        b.close()
