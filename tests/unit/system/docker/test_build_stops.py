"""Ctrl-C to nodekit alone (a signal to its pid, as `kill -INT` or a supervisor sends) during a build: the build is
nodekit's own child, the signal ends it, and nodekit goes on only once it is gone. A real process stands in for the
docker CLI."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from nodekit.system import docker, proc

FAKE_DOCKER = """#!/bin/sh
trap 'trap "" TERM INT; sleep 1; echo ended > {ended}; exit 143' TERM INT
echo $$ > {pidfile}
echo "#1 [internal] load build definition" >&2
printf 'the first bytes of the layer'
sleep 30 &
wait
"""


def test_a_signal_during_the_build_ends_it_before_nodekit_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pidfile, ended = tmp_path / "docker.pid", tmp_path / "ended"
    fake = bin_dir / "docker"
    fake.write_text(FAKE_DOCKER.format(pidfile=pidfile, ended=ended))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    lines: list[str] = []
    with pytest.raises(proc.Interrupted), proc.stopping():
        build = docker.buildx_export(tmp_path, dockerfile=tmp_path / "Dockerfile", target="layer-packages",
                                     build_contexts={}, build_args={}, on_line=lines.append)  # fmt: skip
        for _chunk in build:
            os.kill(os.getpid(), signal.SIGINT)  # to nodekit alone, not to its process group
            time.sleep(10)
    assert lines in ([], ["#1 [internal] load build definition"])
    assert ended.read_text() == "ended\n", "nodekit went on before the build had ended"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)
    assert proc.live() == []
