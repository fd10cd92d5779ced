"""The relay tree over real SSH and real engines (nodekit/ship/tree.py, nodekit/ship/relay.py): four nodes, each
feeding at most two others (h1 feeds h2 and h3, h2 feeds h4: two levels below the root), the head's link carrying
one copy; and a node in the middle of the tree killed mid-stream, which cuts off only its own subtree, named, and
fed again from the head.

The cluster is five hosts (h0 the head), with Debian's sshd in each, set up as in tests/cluster/test_relay.py; the
head's link counters (``ip -s link`` in h0) say how many copies left the head.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from benchmarks._shipnet import tbf_argv
from tests.cluster.harness import Cluster, Host, sh
from tests.cluster.helpers import (
    MIB,
    REF,
    Fleet,
    SshKeys,
    fleet_on,
    head_tx,
    ids,
    loading,
    make_image,
    push_argv,
    push_env,
    relay_dirs,
    wipe,
)

pytestmark = [pytest.mark.cluster, pytest.mark.docker]


@pytest.fixture(scope="module")
def five(cluster_ready: None, ssh_keys: SshKeys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Five hosts with sshd: the head h0 and four nodes, shared by this module's tests (each cleans what it uses)."""
    c = Cluster(5, name="nkt", owner=os.getpid(), decoy=False)
    c.up()
    try:
        yield from fleet_on(c, ssh_keys, tmp_path_factory.mktemp("tree"))
    finally:
        c.down(purge=True)


def revive(fleet: Fleet, host: Host) -> None:
    """``host``, killed by a test (engine, sshd and all), started again as the module's fixture started it."""
    fleet.cluster.restart(host)
    host.stop_sshd()
    host.start_sshd(fleet.keys.public(fleet.keys.client_key), fleet.keys.host_key)


def fresh_image(fleet: Fleet) -> str:
    """A new random image on the head (gzip cannot shrink it: the stream is about MIB MiB), none on the nodes."""
    h0, *nodes = fleet.cluster.hosts
    wipe(*nodes)
    if h0.image_id(REF):
        h0.docker("rmi", "-f", REF)
    return make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)


def test_four_nodes_form_a_tree_two_levels_deep_and_the_head_sends_one_copy(five: Fleet) -> None:
    h0, h1, h2, h3, h4 = five.cluster.hosts
    want = fresh_image(five)
    dirs = relay_dirs(five.cluster)
    shown = h0.run(*push_argv(five, h1, h2, h3, h4), "--dry-run", env=push_env(five), timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "    the head feeds h1\n    h1 feeds h2, h3\n    h2 feeds h4\n" in shown.stdout, shown.stdout
    assert "carries 1 copy of this stream" in shown.stdout and ids(h1) == set()
    before = head_tx(h0)
    done = h0.run(*push_argv(five, h1, h2, h3, h4), env=push_env(five), timeout=300)
    sent = head_tx(h0) - before
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(h.image_id(REF) == want for h in (h1, h2, h3, h4))
    assert "h1 -> h2, h3; h2 -> h4 (relayed)" in done.stderr, done.stderr
    for node, feeder in (("h2", "h1"), ("h3", "h1"), ("h4", "h2")):
        assert f"{node}: loaded" in done.stderr and f"relayed by {feeder}" in done.stderr, done.stderr
    # One copy of the stream for four nodes (plus SSH's framing and the survey's and checks' queries), not two.
    assert MIB << 20 < sent < 1.3 * (MIB << 20), f"the head's link sent {sent} bytes for one {MIB} MiB stream"
    assert relay_dirs(five.cluster) == dirs and not any(loading(h) for h in (h1, h2, h3, h4))


def test_a_node_killed_inside_the_tree_cuts_off_only_its_subtree_which_the_head_feeds_by_name(five: Fleet) -> None:
    c = five.cluster
    h0, h1, h2, h3, h4 = c.hosts
    want = fresh_image(five)
    dirs = relay_dirs(five.cluster)
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))  # about 5 s for the stream: time to kill h2 in the middle
    try:
        proc = subprocess.Popen(h0.argv(*push_argv(five, h1, h2, h3, h4)), env=h0.env(push_env(five)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not loading(h4):
            assert proc.poll() is None and time.monotonic() < deadline, "the relay never reached h4"
            time.sleep(0.1)
        time.sleep(1.0)
        assert proc.poll() is None, "the push ended before h2 could be killed"
        h2.stop()  # h2, which feeds h4, dies: its engine, its sshd, its relay step
        out, err = proc.communicate(timeout=300)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
    try:
        assert proc.returncode == 1, out + err
        # h3, h2's sibling, and h1 above it went on through the tree; h4, below h2, was fed from the head.
        assert "h3: loaded" in err and "relayed by h1" in err, err
        assert h1.image_id(REF) == want and h3.image_id(REF) == want and h4.image_id(REF) == want, err
        assert "the relay tree did not deliver to every node: h2 failed (" in err, err
        assert "cutting off h4; sending to h2, h4 from the head" in err, err
        assert "h4: loaded" in err.split("sending to h2, h4 from the head")[1], err
        assert "h2" in err.splitlines()[-2] + err.splitlines()[-1], err  # the push's failure names the dead node
        assert not loading(h4) and not loading(h3)
    finally:
        # Only the killed node's directory stays (SIGKILL runs no cleanup).
        left = relay_dirs(five.cluster) - dirs
        for d in left:
            shutil.rmtree(d)
        revive(five, h2)
    assert len(left) <= 1, left
    assert ids(h2) == set(), "the killed node kept a partial image"


def test_when_the_root_dies_the_nodes_below_it_are_fed_through_a_new_tree_not_one_copy_each(five: Fleet) -> None:
    """The root (h1) killed mid-stream cuts off every other node: they get the image through a new tree of their
    own, so the head's link carries about two copies in all (part of the first, then one), not one per node."""
    c = five.cluster
    h0, h1, h2, h3, h4 = c.hosts
    want = fresh_image(five)
    dirs = relay_dirs(five.cluster)
    before = head_tx(h0)
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))
    try:
        proc = subprocess.Popen(h0.argv(*push_argv(five, h1, h2, h3, h4)), env=h0.env(push_env(five)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not loading(h4):
            assert proc.poll() is None and time.monotonic() < deadline, "the relay never reached h4"
            time.sleep(0.1)
        time.sleep(1.0)
        assert proc.poll() is None, "the push ended before h1 could be killed"
        h1.stop()
        out, err = proc.communicate(timeout=300)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
    sent = head_tx(h0) - before
    try:
        assert proc.returncode == 1, out + err
        assert "h1 failed (" in err and "cutting off h2, h3, h4" in err, err
        assert "sending to h1 from the head and sending to h2, h3, h4 through a new relay tree" in err, err
        assert all(h.image_id(REF) == want for h in (h2, h3, h4)), err
        assert sent < 2.2 * (MIB << 20), f"the head's link sent {sent / (MIB << 20):.2f} copies"
    finally:
        left = relay_dirs(five.cluster) - dirs
        for d in left:
            shutil.rmtree(d)
        revive(five, h1)
    assert len(left) <= 1, left
