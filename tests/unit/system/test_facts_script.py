"""One gatherer of a host's facts (issue 29): ``nodekit up`` runs the facts script here, ``nodekit run`` sends the
same script over SSH, and both read its lines with the same parser. Before, the two disagreed on one host: up passed
every entry of /dev/infiniband to the container, run only the verbs, rdma_cm and umad devices, and they counted GPUs
differently. Here both run against one host laid out under a directory (its /dev, /proc and the engine's pidfile);
the SSH side goes through remote.gather and an ssh that runs what it is given on that host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodekit.backends.fleet import remote
from nodekit.backends.fleet.hosts import parse_host
from nodekit.system.host import facts

H100 = "NVIDIA H100 80GB HBM3"
SSH = """#!/bin/sh
# A host's login shell, reached as ssh would reach it: the command is the last argument; the host's files are
# under $FAKE_ROOT (the script's R, which is '' on a real host).
for last; do :; done
printf '%s' "$last" | sed "1s|^R=''\\$|R='$FAKE_ROOT'|" > "$FAKE_ROOT/.facts.sh"
exec sh "$FAKE_ROOT/.facts.sh"
"""


def host_root(d: Path) -> Path:
    """A host with two GPUs, InfiniBand (the devices a container needs, and two it does not), and a Docker daemon
    whose limits differ from this process's."""
    for name in ("uverbs0", "uverbs1", "rdma_cm", "umad0", "issm0", "ucm0"):
        (d / "dev" / "infiniband").mkdir(parents=True, exist_ok=True)
        (d / "dev" / "infiniband" / name).touch()
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        gpu = d / "proc" / "driver" / "nvidia" / "gpus" / bus
        gpu.mkdir(parents=True)
        (gpu / "information").write_text(f"Model: \t {H100}\nIRQ:   45\n")
    (d / "run").mkdir()
    (d / "run" / "docker.pid").write_text("4242\n")
    (d / "proc" / "4242").mkdir()
    (d / "proc" / "4242" / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max stack size            8388608              16777216             bytes\n"
        "Max open files            1048576              1048576              files\n"
        "Max locked memory         65536                65536                bytes\n"
    )
    (d / "proc" / "net").mkdir()
    (d / "proc" / "net" / "fib_trie").write_text(FIB_TRIE)
    (d / "proc" / "net" / "if_inet6").write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\nfe800000000000000000000000000001 02 40 20 80     eth0\n"
    )
    return d


# /proc/net/fib_trie of a host with 10.0.0.5/24 on eth0 (its main table; the local table repeats the addresses).
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 10.0.0.0/24 2 0 2
        +-- 10.0.0.0/30 2 0 2
           |-- 10.0.0.0
              /24 link UNICAST
           |-- 10.0.0.5
              /32 host LOCAL
        |-- 10.0.0.255
           /32 link BROADCAST
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
        |-- 10.0.0.5
           /32 host LOCAL
"""


def test_up_and_run_see_one_host_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = host_root(tmp_path / "host")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ROOT", str(root))

    here = facts.gather(root=root)  # nodekit up
    there = remote.gather(parse_host("ssh://me@gpu-7", 0))  # nodekit run
    assert isinstance(there, remote.Gathered), there
    expected = (
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/umad0",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
    )
    assert here.infiniband == there.facts.infiniband == expected
    assert here.gpu_models == there.facts.gpu_models == (H100, H100) and here.gpu_count == there.facts.gpu_count == 2
    limits = (here.memlock_hard, here.stack_hard, here.nofile_hard)
    assert limits == (there.facts.memlock_hard, there.facts.stack_hard, there.facts.nofile_hard)
    assert limits == (65536, 16777216, 1048576)  # the daemon's, not this process's
    # The host's own addresses, for the head's check that main is one of host 0's (its /proc: no iproute2 needed).
    assert facts.run_script(root).addresses == there.addresses == {"10.0.0.5", "127.0.0.1", "::1", "fe80::1"}


def test_without_a_readable_daemon_the_logins_hard_limits_count(tmp_path: Path) -> None:
    root = host_root(tmp_path / "host")
    (root / "run" / "docker.pid").unlink()
    got = facts.run_script(root).facts
    import resource

    stack = resource.getrlimit(resource.RLIMIT_STACK)[1]
    assert got.stack_hard == (None if stack == resource.RLIM_INFINITY else stack)
    assert got.gpu_count == 2 and got.infiniband  # the rest as before


def test_a_host_without_gpus_or_infiniband_reports_none(tmp_path: Path) -> None:
    (tmp_path / "bare" / "dev").mkdir(parents=True)
    got = facts.run_script(tmp_path / "bare").facts
    assert (got.gpu_count, got.gpu_models, got.infiniband) == (0, (), ())
