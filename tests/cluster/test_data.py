"""A dataset declared with ``source`` reaches three hosts over real SSH (Debian's sshd in every host, the hosts'
own python3 running the receiver), and stays identical to the source: a push that changes nothing carries no
payload, a one-file change carries that file, a damaged copy on one host is repaired by the next push. The reverse
direction: `nodekit data gather` brings every host's output directory back, and a job whose main host dies resumes
on the two others from the checkpoint that only main's host had written. (`nodekit run` pushing a sourced mount
before any container starts is part of tests/cluster/test_fleet.py's three-node run.)

The virtual hosts share one file system, so each host's copy is kept on its own path (``[nodes.R] mounts``), as it
would be on its own disk; each path's manifest is compared with the source's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks._shipnet import tbf_argv
from tests.cluster.harness import Cluster, Host, pids_in_netns, sh
from tests.cluster.helpers import (
    ROOT,
    Demo,
    Fleet,
    SshKeys,
    finish,
    fleet_on,
    head_tx,
    nodekit_argv,
    relay_dirs,
    same_as_source,
    wait_for,
)
from tests.conftest import cluster_name

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

SMALL = 300
BIG_MIB = 8


def _project(
    fleet: Fleet, base: Path, *, mib_files: int = 0, big_mib: int = BIG_MIB, skip_head: bool = False
) -> tuple[Path, Path, list[Path]]:
    """A project whose dataset holds SMALL small files and one ``big_mib`` file (or ``mib_files`` files of 1 MiB),
    on every host of ``fleet`` (but its head with ``skip_head``)."""
    project, data = base / "project", base / "project" / "data"
    hosts = fleet.cluster.hosts[1:] if skip_head else fleet.cluster.hosts
    paths = [base / f"on-{h.name}" for h in hosts]
    (data / "shards").mkdir(parents=True)
    for i in range(SMALL):
        (data / "shards" / f"{i:04d}.jpg").write_bytes(os.urandom(2000 + i))
    if mib_files:
        for i in range(mib_files):
            (data / f"part-{i:02d}.arrow").write_bytes(os.urandom(1 << 20))
    else:
        (data / "train.parquet").write_bytes(os.urandom(big_mib << 20))
    toml = ['name = "datatest"', 'script = "train.py"', f"nnodes = {len(paths)}",
            f"hosts = {json.dumps([fleet.url(h) for h in hosts])}", "",
            "[[mounts]]", 'source = "data"', 'host = "/unused"', 'container = "/data"', 'check = "hashes"']  # fmt: skip
    for rank, p in enumerate(paths):
        toml += ["", f"[nodes.{rank}]", f'mounts = {{ "/data" = "{p}" }}']
    (project / "nodekit.toml").write_text("\n".join(toml) + "\n")
    (project / "train.py").write_text("print('hi')\n")
    return project, data, paths


def _push(fleet: Fleet, project: Path, *extra: str) -> tuple[int, str, int]:
    """`nodekit data push` on the head: its exit code, its output, the payload bytes it reports."""
    h0 = fleet.cluster.main
    done = h0.run(*nodekit_argv("data", "push", "--config", str(project / "nodekit.toml"), *extra), env=fleet.env,
                  cwd=project, timeout=120)  # fmt: skip
    out = done.stdout + done.stderr
    found = re.search(r"sent (\d+) bytes", out.strip().splitlines()[-1]) if out.strip() else None
    return done.returncode, out, int(found.group(1)) if found else -1


def test_a_dataset_reaches_three_hosts_and_only_what_changed_travels(fleet: Fleet, tmp_path: Path) -> None:
    project, data, paths = _project(fleet, tmp_path)
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    h0 = fleet.cluster.main

    code, out, sent = _push(fleet, project)
    assert code == 0, out
    same_as_source(data, paths)
    assert sent == 3 * total, out  # one stream per host: below RELAY_MIN_BYTES, `--relay auto` builds no tree

    before = head_tx(h0)
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 0, out
    assert head_tx(h0) - before < 1 << 20  # scans only: the receiver's code and the manifests, no payload

    changed = data / "shards" / "0042.jpg"
    changed.write_bytes(os.urandom(5000))
    (data / "shards" / "0007.jpg").rename(data / "moved.jpg")  # a rename travels as a copy on each node
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 3 * 5000, out
    same_as_source(data, paths)

    damaged = paths[1] / "train.parquet"
    with open(damaged, "r+b") as f:
        f.seek(3 << 20)
        b = f.read(1)
        f.seek(3 << 20)
        f.write(bytes([b[0] ^ 0x01]))
    os.truncate(paths[1] / "shards" / "0100.jpg", 10)
    code, out, sent = _push(fleet, project)
    assert code == 0, out
    assert sent == (BIG_MIB << 20) + 2100, out  # the two damaged files, to the one host that lacked them
    same_as_source(data, paths)


def test_a_file_source_reaches_three_hosts_as_that_file_and_a_no_change_push_sends_nothing(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A ``source`` that is one file: each host's host path becomes exactly that file (hash for hash), beside a
    file of the user's that stays untouched; a no-change push carries no payload, a change carries that file."""
    project, data, _ = _project(fleet, tmp_path)
    src = data / "train.parquet"
    dirs = [tmp_path / f"shelf-{h.name}" for h in fleet.cluster.hosts]
    toml = (project / "nodekit.toml").read_text().replace('source = "data"', f'source = "{src}"')
    for rank, d in enumerate(dirs):
        d.mkdir()
        (d / "theirs.txt").write_text("the user's")
        toml = toml.replace(f'mounts = {{ "/data" = "{tmp_path / f"on-{fleet.cluster.hosts[rank].name}"}" }}',
                            f'mounts = {{ "/data" = "{d / "tokens.parquet"}" }}')  # fmt: skip
    (project / "nodekit.toml").write_text(toml)
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 3 * src.stat().st_size, out
    for d in dirs:
        assert hashlib.sha256((d / "tokens.parquet").read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
        assert (d / "theirs.txt").read_text() == "the user's"
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 0, out
    src.write_bytes(os.urandom(3000))
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 3 * 3000, out
    assert all((d / "tokens.parquet").read_bytes() == src.read_bytes() for d in dirs)
    with open(dirs[2] / "tokens.parquet", "r+b") as f:  # a byte rewritten, its size and time kept: --verify sees it
        st = os.fstat(f.fileno())
        f.write(bytes([src.read_bytes()[0] ^ 0x01]))
    os.utime(dirs[2] / "tokens.parquet", ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out, _ = _push(fleet, project, "--verify")
    assert code == 1 and f"{dirs[2] / 'tokens.parquet'}" in out and "content differs" in out, out
    code, out, sent = _push(fleet, project, "--verify")
    assert code == 0 and sent == 3000, out  # the read-back taught the host's cache: this push repairs it
    code, out, sent = _push(fleet, project, "--verify")
    assert code == 0 and sent == 0 and "every file read back from disk" in out, out


@pytest.fixture
def four(cluster_ready: None, ssh_keys: SshKeys, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Four hosts with sshd: the head h0 and three nodes."""
    c = Cluster(4, name=cluster_name(request.node.nodeid), owner=os.getpid())
    c.up()
    try:
        yield from fleet_on(c, ssh_keys, tmp_path / "four")
    finally:
        c.down()


def _hop_lines(fleet: Fleet) -> list[str]:
    """Hop-key lines left in the login user's authorized_keys on any host."""
    out = []
    for h in fleet.cluster.hosts:
        keys = h.home / ".ssh" / "authorized_keys"
        out += [ln for ln in (keys.read_text() if keys.exists() else "").splitlines() if ln.endswith("nodekit-relay")]
    return out


def test_a_first_push_to_three_hosts_goes_down_one_relay_tree_with_one_copy_on_the_heads_link(
    four: Fleet, tmp_path: Path
) -> None:
    """The head scans every host, then sends one stream down a relay tree (a chain: h1 feeds h2, which feeds h3, as
    every dataset tree up to CHAIN_MAX host paths; nodekit/data/tree.py): its link carries
    about one copy of the dataset, not three; every host ends identical to the source, and nothing of the relay
    (directories, hop-key lines) is left on any node."""
    project, data, paths = _project(four, tmp_path, big_mib=24, skip_head=True)
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    h0 = four.cluster.main
    dirs = relay_dirs(four.cluster)
    code, out, _ = _push(four, project, "--relay", "always", "--dry-run")
    assert code == 0, out
    node = r"node \d \([^)]*\)"
    shape = rf"\n  the head feeds node 0 \([^)]*\)\n  {node} feeds node 1 \([^)]*\)\n  node 1 \([^)]*\) feeds node 2 "
    assert re.search(shape, out), out
    assert f"would send {total} bytes in all" in out, out
    before = head_tx(h0)
    code, out, sent = _push(four, project, "--relay", "always")
    carried = head_tx(h0) - before
    assert code == 0, out
    same_as_source(data, paths)
    assert re.search(
        r"through a relay tree to node 0 \([^)]*\) -> node 1 \([^)]*\); node 1 \([^)]*\) -> node 2 ", out
    ), out
    assert "2 relayed by other hosts" in out, out
    assert "sending it from the head" not in out, out
    assert sent == total, out
    assert total < carried < 1.5 * total, f"the head's link carried {carried} bytes for a {total}-byte dataset"
    assert relay_dirs(four.cluster) == dirs and _hop_lines(four) == []
    code, out, sent = _push(four, project, "--relay", "always")  # nothing lacks: no tree, no payload
    assert code == 0 and sent == 0, out
    for p in paths:  # the same first push without the tree, for contrast: one copy per host
        shutil.rmtree(p)
    before = head_tx(h0)
    code, out, sent = _push(four, project, "--relay", "never")
    direct = head_tx(h0) - before
    assert code == 0 and sent == 3 * total and direct > 2.5 * total, (direct, out)
    same_as_source(data, paths)


def _part_bytes(path: Path) -> int:
    """Bytes of contents still arriving (``.part``) in ``path``'s staging."""
    staging = path / ".nodekit-data" / "staging"
    n = 0
    for p in staging.glob("*.part") if staging.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # renamed once whole, between the listing and this
            n += p.stat().st_size
    return n


def _dataset_processes(cluster: Cluster) -> list[str]:
    """Receivers (their boot names the datasync package), relay steps and ssh clients still running in any host."""
    found = []
    for h in cluster.hosts:
        for pid in pids_in_netns(os.stat(h.netns_path).st_ino):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            line = b" ".join(argv).decode(errors="replace")
            if "launcher.datasync" in line or "nodekit-relay" in line or os.path.basename(argv[0]) == b"ssh":
                found.append(f"{h.name}:{pid} {line[:120]}")
    return found


def _root_fails_mid_push(
    four: Fleet,
    tmp_path: Path,
    fault: Callable[[Host], object],
    *patch: str,
    heal: Callable[[Host], object] | None = None,
) -> str:
    """A first push of 25 MiB to h1, h2, h3 through one tree (a chain: h1 feeds h2, h2 feeds h3), the head's link at 40
    Mbit/s until ``fault`` strikes h1, once the big file is on its way to h3 through it; ``patch``: production
    constants shortened (tests/cluster/patched.py). Asserts what must hold however h1 failed: h2 and h3, cut off
    below it, are scanned again and fed through a second tree of their own, not one stream each, so the head's link
    carries the part of the first copy that went out plus about one copy more; both end identical to the source;
    each is named with the node above it; h1 is named in the last line with the fix, the push exits 1, and no
    receiver, relay step or hop key is left anywhere within 90 s of ``heal`` (h1 back on the network: a host cut off
    cannot be asked to clean up). Returns the push's output."""
    project, data, paths = _project(four, tmp_path, big_mib=24, skip_head=True)
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    h0, h1 = four.cluster.hosts[:2]
    cli = [sys.executable, "-m", "tests.cluster.patched", *patch, "--"] if patch else nodekit_argv()
    argv = h0.argv(*cli, "data", "push", "--config", str(project / "nodekit.toml"), "--relay", "always")
    before = head_tx(h0)
    proc = None
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))  # about 5 s for the stream: time to strike h1 in the middle
    try:
        proc = subprocess.Popen(argv, env=h0.env({**four.env, "PYTHONPATH": str(ROOT)}), cwd=project,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 90
        while _part_bytes(paths[2]) < 2 << 20:  # the small files arrived, the big one is on its way through h1
            assert proc.poll() is None and time.monotonic() < deadline, "the tree's stream never reached h3"
            time.sleep(0.05)
        fault(h1)
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
        out, err = proc.communicate(timeout=240)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    if heal is not None:
        heal(h1)
    carried = head_tx(h0) - before
    said = out + err
    print(f"{said}the head's link carried {carried / total:.2f} copies")
    assert proc.returncode == 1, said
    same_as_source(data, paths[1:])
    dead = r"node 0 \([^)]*\)"
    assert re.search(
        r"through a relay tree to node 0 \([^)]*\) -> node 1 \([^)]*\); node 1 \([^)]*\) -> node 2 ", said
    ), said
    for n in (1, 2):  # each cut-off host named with the node above it that the stream stopped at, and how it is fed
        above = rf"node {n - 1} \([^)]*\)"
        cut = rf"node {n} \([^)]*\):{re.escape(str(paths[n]))}: the stream from {above} stopped before it reached"
        assert re.search(cut + r" it; sending it through a second relay tree \(2 host paths", said), said
    assert re.search(r"through a second relay tree to node 1 \([^)]*\) -> node 2 ", said), said
    assert "sending it from the head" not in said, said  # no stream of its own for either
    last = err.strip().splitlines()[-1]
    assert re.search(dead, last) and "the 2 other host path(s) are the source's" in last and "Fix:" in last, last
    # Part of the first copy (the fault came mid-stream), then one copy of what h2 and h3 still lacked, not two.
    assert total < carried < 1.7 * total, f"the head's link carried {carried / total:.2f} copies"
    wait = time.monotonic() + 90
    while left := _dataset_processes(four.cluster):
        assert time.monotonic() < wait, f"left running after the push: {left}"
        time.sleep(0.2)
    assert _hop_lines(four) == []
    return said


def test_an_inner_node_that_dies_mid_push_cuts_only_its_subtree_which_a_second_tree_feeds_by_name(
    four: Fleet, tmp_path: Path
) -> None:
    """h1, the tree's root, dies mid-stream (engine, sshd, relay step, receiver: everything in its namespace):
    :func:`_root_fails_mid_push`. Its relay directory is all it leaves (SIGKILL runs no cleanup)."""
    dirs = relay_dirs(four.cluster)
    try:
        _root_fails_mid_push(four, tmp_path, lambda h1: h1.stop())
    finally:
        stale = relay_dirs(four.cluster) - dirs
        for d in stale:
            shutil.rmtree(d)
    assert len(stale) <= 1, stale


@pytest.mark.big  # about 60 s (the stall deadline, then the silent host's scan to SSH's keepalive): make test-big
def test_an_inner_node_whose_link_stalls_mid_push_is_cut_by_the_trees_one_stall_deadline_and_the_next_push_finishes(
    four: Fleet, tmp_path: Path
) -> None:
    """h1, the tree's root, vanishes from the network mid-stream (every packet dropped: TCP hangs, nothing resets),
    its processes running on. The head's write into the tree stands still; the relay sink's stall deadline (5 s
    here, 60 s in production) cuts the tree on every node it reaches, and the rest is :func:`_root_fails_mid_push`.
    Once h1 is back, the relay step it ran ends by itself and cleans up (no relay directory left), and the next push
    makes h1 equal and exits 0."""
    dirs = relay_dirs(four.cluster)
    h1 = four.cluster.hosts[1]
    try:
        said = _root_fails_mid_push(four, tmp_path, Host.isolate, "nodekit.ship.relay.STALL_S=5", heal=Host.rejoin)
    finally:
        h1.rejoin()
    assert re.search(r"the relay tree from node 0 \([^)]*\) took nothing for 5 s", said), said
    wait = time.monotonic() + 90
    while relay_dirs(four.cluster) != dirs:
        assert time.monotonic() < wait, f"left on a node: {relay_dirs(four.cluster) - dirs}"
        time.sleep(0.5)
    code, out, _ = _push(four, tmp_path / "project")
    assert code == 0 and "dataset identical to the source on 3 host(s)" in out, out


def _staged_bytes(path: Path) -> int:
    staging = path / ".nodekit-data" / "staging"
    if not staging.is_dir():
        return 0
    n = 0
    for p in staging.iterdir():
        if not p.name.endswith(".part"):
            with contextlib.suppress(FileNotFoundError):  # moved to its name, between the listing and this
                n += p.stat().st_size
    return n


def test_ctrl_c_mid_push_leaves_every_host_able_to_finish(fleet: Fleet, tmp_path: Path) -> None:
    """SIGINT while every host's stream flows (the head's link slowed to 40 Mbit/s): nodekit exits 130, no file
    stands half-written under its name on any host, and the next push sends exactly what had not arrived whole."""
    project, data, paths = _project(fleet, tmp_path, mib_files=16)
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    h0 = fleet.cluster.main
    argv = h0.argv(*nodekit_argv("data", "push", "--config", str(project / "nodekit.toml")))
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))  # about 10 s for three streams of 16 MiB
    try:
        proc = subprocess.Popen(argv, env=h0.env(fleet.env), cwd=project, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while sum(_staged_bytes(p) for p in paths) < 3 << 20:  # a few MiB arrived whole: mid-stream
            assert proc.poll() is None and time.monotonic() < deadline, "the push never got going"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
    assert proc.returncode == 130, out + err
    assert "SIGINT received: stopped" in err, err
    for p in paths:  # whatever has a name on a host is the source's file of that name
        for f in p.rglob("*"):
            if f.is_file() and ".nodekit-data" not in f.parts:
                assert f.read_bytes() == (data / f.relative_to(p)).read_bytes(), f
    deadline = time.monotonic() + 30  # each receiver ends once its SSH session has (its input closed)
    while sh("pgrep", "-f", "nodekit.launcher.datasync.receive", check=False).returncode == 0:
        assert time.monotonic() < deadline, "a receiver outlived the push"
        time.sleep(0.2)
    # Whole on a host: staged, or already under its name (a host whose stream ended before the signal: the head's
    # own path is a local copy, over in a moment).
    placed = sum(
        f.stat().st_size for p in paths for f in p.rglob("*") if f.is_file() and ".nodekit-data" not in f.parts
    )
    arrived = sum(_staged_bytes(p) for p in paths) + placed
    assert 0 < arrived < 3 * total
    code, out, sent = _push(fleet, project)
    assert code == 0, out
    assert sent == 3 * total - arrived, out  # nothing that arrived whole travels again
    same_as_source(data, paths)


def test_gather_brings_every_hosts_outputs_back_one_directory_per_node_identical_files_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Three hosts, each output directory on its own path: `nodekit data gather` over SSH makes gathered/node-R
    hold exactly host R's files, a checkpoint all three wrote travels once and is stored once, and a second run
    fetches nothing."""
    hosts = fleet.cluster.hosts
    disks = [tmp_path / f"on-{h.name}" / "outputs" for h in hosts]
    shared = os.urandom(6 << 20)
    for rank, d in enumerate(disks):
        (d / "ckpt").mkdir(parents=True)
        (d / "ckpt" / "last.pt").write_bytes(shared)
        (d / f"metrics-{rank}.json").write_text(json.dumps({"rank": rank}))
        (d / "nodekit").mkdir()
        (d / "nodekit" / f"node-{rank}.log").write_text(f"log of node {rank}\n")
    project = tmp_path / "project"
    project.mkdir()
    toml = ['name = "gathertest"', 'script = "train.py"', f"nnodes = {len(hosts)}",
            f"hosts = {json.dumps([fleet.url(h) for h in hosts])}"]  # fmt: skip
    for rank, d in enumerate(disks):
        toml += ["", f"[nodes.{rank}]", f'output_dir = "{d}"']
    (project / "nodekit.toml").write_text("\n".join(toml) + "\n")
    (project / "train.py").write_text("print('hi')\n")
    argv = nodekit_argv("data", "gather", "--config", str(project / "nodekit.toml"))
    done = fleet.cluster.main.run(*argv, env=fleet.env, cwd=project, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    fetched = int(re.search(r"fetched (\d+) bytes", out).group(1))  # type: ignore[union-attr]
    assert (6 << 20) < fetched < (6 << 20) + 4096, out  # the checkpoint once, the small files
    dest = project / "gathered"
    for rank, d in enumerate(disks):
        mine = sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.is_file())
        got = sorted(
            str(f.relative_to(dest / f"node-{rank}")) for f in (dest / f"node-{rank}").rglob("*") if f.is_file()
        )
        assert got == mine
        for name in mine:
            assert (dest / f"node-{rank}" / name).read_bytes() == (d / name).read_bytes(), name
    assert len({(dest / f"node-{r}" / "ckpt" / "last.pt").stat().st_ino for r in range(3)}) == 1  # stored once
    again = fleet.cluster.main.run(*argv, env=fleet.env, cwd=project, timeout=120)
    assert again.returncode == 0 and "fetched 0 bytes" in again.stdout + again.stderr, again.stdout + again.stderr


@pytest.fixture
def fleet4(demo_on_main: Demo, ssh_keys: SshKeys, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Four hosts over real SSH: host 0 is the head only (it runs `nodekit run` and holds the demo image), hosts 1
    to 3 run the job, so that the job's main host can die without the head."""
    c = Cluster(4, name=cluster_name(request.node.nodeid), owner=os.getpid())
    c.up()
    try:
        yield from fleet_on(c, ssh_keys, tmp_path)
    finally:
        try:
            leave_no_container(c)
        finally:
            c.down()


def leave_no_container(c: Cluster) -> None:
    """The group's later tests share these hosts' data roots (its cluster name): a container left on a host the test
    killed (its engine died under it, exit 255) would be found there by every later test's check that nothing is
    left. So a killed host's engine is started again, and every host's containers removed."""
    for h in c.hosts:
        if h.docker("info", check=False, timeout=30).returncode != 0:
            c.restart(h)
        left = h.docker("ps", "-aq", check=False).stdout.split()
        if left:
            h.docker("rm", "-f", *left, check=False)


def test_main_host_lost_mid_training_the_job_resumes_on_the_others_from_mains_checkpoint(
    demo_on_main: Demo, fleet4: Fleet, tmp_path: Path
) -> None:
    """Rank 0 alone saves checkpoint.pt (examples/ddp), each host's /outputs on a path of its own. Main's host dies
    mid-training: `nodekit run` (restarts = 1, min_nodes = 2) goes on with the two others, the newest checkpoint
    reaches them before they start (the head's mirror and hand-off), and the job resumes past epoch 0 and ends 0."""
    job_hosts = fleet4.cluster.hosts[1:]
    disks = [tmp_path / f"on-{h.name}" / "outputs" for h in job_hosts]
    project = fleet4.project(demo_on_main, tmp_path, hosts=[fleet4.url(h) for h in job_hosts], restarts=1,
                             min_nodes=2, args=["--epochs", "20", "--epoch-delay", "0.5"])  # fmt: skip
    with open(project / "nodekit.toml", "a") as f:
        f.write("".join(f'\n[nodes.{r}]\noutput_dir = "{d}"\n' for r, d in enumerate(disks)))
    log = tmp_path / "run.log"
    proc = fleet4.run(project, "--image", demo_on_main.ref, log=log)
    wait_for(log, "ddp-demo: epoch 2 done", proc, 300)
    deadline = time.monotonic() + 90

    def mirrored() -> dict[Path, int]:
        found = {}
        for p in (project / ".nodekit" / "mirror").glob("run-*/objects/*"):
            with contextlib.suppress(FileNotFoundError):
                found[p] = p.stat().st_size
        return found

    # The newest checkpoint.pt the head holds must be past epoch 0: a mirror round after the first one fetched a
    # content of the checkpoint's size. Counting objects is not enough: the first round can fetch epoch 0's
    # checkpoint.pt and the next one's checkpoint.pt.tmp (the script's write before its rename) at once. One saved
    # less than a mirror round before the loss is not there yet (docs/guides/restarts-and-resume.md).
    while not mirrored():
        assert proc.poll() is None and time.monotonic() < deadline, "the head never mirrored main's checkpoints"
        time.sleep(0.5)
    time.sleep(1)  # the first round's fetches end
    first = set(mirrored())
    while not any(p not in first and size == (disks[0] / "checkpoint.pt").stat().st_size
                  for p, size in mirrored().items()):  # fmt: skip
        assert proc.poll() is None and time.monotonic() < deadline, "the head mirrored no later checkpoint"
        time.sleep(0.5)
    assert (disks[0] / "checkpoint.pt").is_file()
    assert not any((d / "checkpoint.pt").exists() for d in disks[1:]), "rank 0 only saves: the others have none"
    job_hosts[0].stop()
    shutil.move(disks[0], disks[0].with_name("gone"))  # its disk went with it
    code, out = finish(proc, log, 300)
    assert code == 0, out[-6000:]
    assert f"going on without node 0 (root@{job_hosts[0].addr})" in out, out[-4000:]
    assert "hand-off:" in out and "checkpoint.pt" in out, out[-4000:]
    resumed = [int(m) for m in re.findall(r"ddp-demo: resumed from \S+ after epoch (\d+)", out)]
    assert resumed and resumed[0] > 0, out[-4000:]
    r = json.loads((disks[1] / "result.json").read_text())  # the new rank 0: host 2
    assert r["world_size"] == 2 and r["epochs"] == 20 and r["checksums_equal"] is True, r
    assert not list((project / ".nodekit" / "mirror").glob("run-*")), "the mirror outlived the run"
