"""Each host's connection opened while this machine picks the image (nodekit/backends/fleet/remote.py: ``opening``),
with a stand-in ``ssh`` on PATH that logs every call (the real OpenSSH path: the cluster tier's fleet tests)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.backends.fleet import remote
from nodekit.backends.fleet.hosts import parse_host
from nodekit.system import proc
from tests.unit.backends.fleet.stand_ins import on_path

# Host 10.0.0.9 refuses connections (ssh's 255, OpenSSH's line); every other host runs the command here.
SSH = r"""#!/bin/sh
for a; do last=$a; case $a in *10.0.0.9*) bad=1 ;; esac; done
printf '%s\n' "$last" | head -c 40 >> "$CALLS"; echo >> "$CALLS"
[ -n "$bad" ] && { echo "ssh: connect to host 10.0.0.9 port 22: Connection refused" >&2; exit 255; }
sleep 0.2
exec sh -c "$last"
"""


@pytest.fixture
def calls(tmp_path: Path) -> Iterator[Path]:
    with on_path(tmp_path, {"ssh": SSH}) as out:
        yield out


def test_connections_open_at_once_and_a_refused_one_is_named_without_a_second_attempt(calls: Path) -> None:
    good, bad = parse_host("ssh://root@10.0.0.2", 0), parse_host("ssh://root@10.0.0.9", 1)
    with remote.opening([good, bad, parse_host("unix:///run/docker.sock", 2)]) as opened:
        assert sorted(opened) == [0, 1]  # every ssh:// host
        assert opened[0].child.poll() is None  # started without waiting for any (each takes 0.2 s)
        checked = remote.check_host(bad, remote.Expect(), None, opened[1])
        # The good host's script is the opening's own: its shell there ran it, its commands' standard input
        # /dev/null (not the stream the script came on).
        said = opened[0].ask("echo checked; echo stdin=$(readlink /proc/self/fd/0)", 10)
        assert said == "checked\nstdin=/dev/null\n", said
        with pytest.raises(RuntimeError):
            opened[0].ask("echo again", 10)  # once: the shell ended with its script
    [refused] = checked
    assert "Connection refused" in refused.what and "runs sshd" in refused.fix
    # One ssh per host, the check's included: the refused host's check did not dial again, the good one's rode
    # its opening.
    assert [c for c in calls.read_text().splitlines() if c] == [remote.OPEN_COMMAND] * 2


def test_a_host_whose_opening_never_answers_is_named_within_the_checks_deadline(calls: Path, tmp_path: Path) -> None:
    slow = tmp_path / "bin" / "ssh"
    slow.write_text(SSH.replace("sleep 0.2", "sleep 30"))
    with remote.opening([parse_host("ssh://root@10.0.0.2", 0)]) as opened:
        t0 = time.monotonic()
        said = opened[0].ask("echo checked", 0.5)
        assert isinstance(said, remote.Problem) and said.what == "SSH did not answer within 0.5 s", said
        assert time.monotonic() - t0 < 5 and opened[0].child.returncode is not None  # killed, not left to run


def test_leaving_early_ends_the_connections_still_opening(calls: Path, tmp_path: Path) -> None:
    slow = tmp_path / "bin" / "ssh"
    slow.write_text(SSH.replace("sleep 0.2", "sleep 30"))
    with remote.opening([parse_host("ssh://root@10.0.0.2", 0)]) as opened:
        child = opened[0].child
    assert child.returncode is not None and child.returncode != 0  # ended on the way out, not left to run 30 s
    assert child not in proc.live()
