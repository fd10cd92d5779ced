"""Relay chains over real SSH: the head sends the image stream once, to the first node, and each node passes it on
to the next (nodekit/ship/relay.py) while loading it.

Every host runs Debian's sshd; the head (h0) reaches them through an ssh set up as a user's ~/.ssh/config would be
(key file, known_hosts, StrictHostKeyChecking). The nodes' own ssh knows nothing: a hop logs in with the head's key
through agent forwarding (nodekit starts a private ssh-agent, as no user agent runs here) and trusts only the host
key the head passed it. The head's link counters (``ip -s link`` in h0) say how many copies left the head.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks._shipnet import tbf_argv, tx_bytes
from tests.cluster.conftest import Fleet, SshKeys, nodekit_argv
from tests.cluster.harness import Cluster, Host, pids_in_netns, sh, ssh_client
from tests.cluster.test_ship import REF, ids, make_image, wipe

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]

MIB = 24  # random bytes: gzip cannot shrink them, so the stream is about this size


def head_tx(h0: Host) -> int:
    return tx_bytes(sh("ip", "-n", h0.netns, "-s", "-j", "link").stdout, h0.iface)


def push_env(fleet: Fleet) -> dict[str, str]:
    return {**fleet.env, "DOCKER_HOST": fleet.cluster.main.docker_host}  # no user agent: nodekit starts its own


def push_argv(fleet: Fleet, *targets: Host, relay: str = "always") -> list[str]:
    to = [arg for h in targets for arg in ("--to", f"{h.name}={fleet.url(h)}")]
    return nodekit_argv("push", REF, *to, "--relay", relay)


def relay_dirs() -> set[Path]:
    """The relay's temporary directories (the hosts share this machine's /tmp)."""
    return set(Path("/tmp").glob("nodekit-relay.*"))


def loading(host: Host) -> bool:
    """Whether a ``docker load`` runs in ``host`` (the relay's stream has reached it)."""
    for pid in pids_in_netns(os.stat(host.netns_path).st_ino):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"load" in argv and any(a.endswith(b"docker") for a in argv):
            return True
    return False


def test_a_relay_chain_loads_every_node_and_the_head_sends_the_stream_once(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    wipe(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    dirs = relay_dirs()
    before = head_tx(h0)
    done = h0.run(*push_argv(fleet, h1, h2), env=push_env(fleet), timeout=300)
    sent = head_tx(h0) - before
    assert done.returncode == 0, done.stdout + done.stderr
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert "h1 -> h2 (relayed)" in done.stderr and "h2: loaded" in done.stderr and "relayed by h1" in done.stderr
    # One copy of the stream (plus SSH's framing and the survey's queries), not two.
    assert MIB << 20 < sent < 1.3 * (MIB << 20), f"the head's link sent {sent} bytes for one {MIB} MiB stream"
    # Nothing of the relay is left on the nodes: no temporary directory, no process.
    assert relay_dirs() == dirs
    assert not loading(h1) and not loading(h2)


def test_without_relay_the_head_sends_a_copy_per_node(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    wipe(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    before = head_tx(h0)
    done = h0.run(*push_argv(fleet, h1, h2, relay="never"), env=push_env(fleet), timeout=300)
    sent = head_tx(h0) - before
    assert done.returncode == 0, done.stdout + done.stderr
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert "relayed" not in done.stderr
    assert sent > 2 * (MIB << 20), f"two direct streams, but the head's link sent only {sent} bytes"


def test_a_relay_node_killed_mid_transfer_is_named_and_the_next_node_still_gets_the_image(fleet: Fleet) -> None:
    c = fleet.cluster
    h0, h1, h2 = c.hosts
    wipe(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    dirs = relay_dirs()
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))  # about 5 s for the stream: time to kill h1 in the middle
    try:
        proc = subprocess.Popen(
            h0.argv(*push_argv(fleet, h1, h2)),
            env=h0.env(push_env(fleet)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not (loading(h1) and loading(h2)):
            assert proc.poll() is None and time.monotonic() < deadline, "the relay never reached h2"
            time.sleep(0.1)
        time.sleep(1.0)
        assert proc.poll() is None, "the push ended before the relay node could be killed"
        h1.stop()  # the relay node dies: its engine, its sshd, the relay's processes
        out, err = proc.communicate(timeout=300)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
    assert proc.returncode == 1, out + err
    assert "the relay chain did not deliver" in err and "sending to them from the head" in err, err
    assert h2.image_id(REF) == want, err  # the node after the dead relay got the image from the head
    assert "h1" in err.splitlines()[-2] + err.splitlines()[-1], err  # the failure names the dead node
    assert not loading(h2), "a relay process was left running on h2"
    # Only the killed relay node's directory stays (SIGKILL runs no cleanup); h2, the last node, has none left.
    left = relay_dirs() - dirs
    assert all((d / "known_hosts").is_file() for d in left) and len(left) <= 1, [sorted(os.listdir(d)) for d in left]
    for d in left:
        shutil.rmtree(d)
    c.restart(h1)
    assert ids(h1) == set(), "the killed node kept a partial image"


def test_a_node_whose_host_key_the_head_lacks_is_not_relayed_to(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    wipe(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=4)
    # The head reaches h2 with no known_hosts check for it: then no hop can be told which key h2 must show.
    config = fleet.config.read_text()
    fleet.config.write_text(f"Host {h2.addr}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n\n{config}")
    try:
        done = h0.run(*push_argv(fleet, h1, h2), env=push_env(fleet), timeout=300)
    finally:
        fleet.config.write_text(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert "h2: not in the relay chain (the head has no host key for" in done.stderr, done.stderr
    assert "relayed by" not in done.stderr


def accepted(host: Host) -> int:
    """SSH logins host's sshd has accepted so far (its log, LogLevel INFO)."""
    log = host.sshd_dir / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey") if log.exists() else 0


def test_a_push_opens_one_ssh_connection_per_node_and_closes_it(fleet: Fleet) -> None:
    """Six docker calls per node (four survey questions, the load, the id check) share one SSH connection
    (nodekit/ship/mux.py); when the push ends no master connection is left and its directory is gone."""
    h0, h1, h2 = fleet.cluster.hosts
    wipe(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=4)
    before = {h.name: accepted(h) for h in (h1, h2)}
    dirs_before = set(Path("/tmp").glob("nkssh.*"))  # a test killed with SIGKILL earlier may have left one
    done = h0.run(*push_argv(fleet, h1, h2, relay="never"), env=push_env(fleet), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert {h.name: accepted(h) - before[h.name] for h in (h1, h2)} == {"h1": 1, "h2": 1}
    masters = subprocess.run(["pgrep", "-f", "ControlPath=/tmp/nkssh."], capture_output=True, text=True).stdout
    assert masters.strip() == "", f"SSH master connections left running: {masters}"
    assert set(Path("/tmp").glob("nkssh.*")) <= dirs_before, "this push left its mux directory"


CHAINS_SCRIPT = """
import json, sys
from nodekit import ship
from nodekit.progress import NullReporter
from nodekit.ship import relay
relay.CHAIN_MAX = 2  # four nodes: two chains of two
src = ship.source_of(sys.argv[1], None)
targets = [ship.Target(f"h{i}", url) for i, url in enumerate(sys.argv[2:], 1)]
with ship.SharedSsh():
    plan = ship.plan_push(src, ship.survey(src, targets))
    result = ship.push(plan, NullReporter(), relay="always")
print(json.dumps({"sent": result.sent, "relayed": result.relayed}))
"""


def test_four_nodes_with_chains_of_two_make_two_chains(ssh_keys: SshKeys, tmp_path: Path) -> None:
    """Several chains for one stream (at most CHAIN_MAX nodes each, 2 here): the head sends one copy per chain,
    each chain's second node gets it from its first, and every node ends with the image."""
    c = Cluster(5, name="nkr", owner=os.getpid(), decoy=False)
    c.up()
    try:
        h0, *targets = c.hosts
        bin_dir = ssh_client(tmp_path / "ssh", c.hosts, ssh_keys.client_key, ssh_keys.public(ssh_keys.host_key))
        for h in targets:
            h.start_sshd(ssh_keys.public(ssh_keys.client_key), ssh_keys.host_key)
        want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=4)
        env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": ""}
        urls = [f"ssh://root@{h.addr}" for h in targets]
        done = h0.run(sys.executable, "-c", CHAINS_SCRIPT, REF, *urls, env=env, cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["relayed"] == {"h2": "h1", "h4": "h3"}, got
        assert sorted(got["sent"]) == ["h1", "h3"], got  # the head fed the two chains' first nodes only
        assert all(h.image_id(REF) == want for h in targets)
    finally:
        for h in c.hosts:
            h.stop_sshd()
        c.down(purge=True)
