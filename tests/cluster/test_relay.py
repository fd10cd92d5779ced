"""Relay chains over real SSH: the head sends the image stream once, to the first node, and each node passes it on
to the next (nodekit/ship/relay.py) while loading it.

Every host runs Debian's sshd, its sessions with a home directory of their own (Host.home); the head (h0) reaches
them through an ssh set up as a user's ~/.ssh/config would be (key file, known_hosts, StrictHostKeyChecking). The
nodes' own ssh knows nothing: a hop logs in with a key made on its node for the push, which the next node accepts
only for the push's relay step (nodekit/ship/hopkeys.py), and trusts only the host key the head passed it. No
agent is forwarded. The head's link counters (``ip -s link`` in h0) say how many copies left the head.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._shipnet import tbf_argv
from nodekit.ship import hopkeys
from nodekit.ship.relay import parse_report
from tests.cluster.harness import Host, pids_in_netns, sh
from tests.cluster.helpers import (
    MIB,
    REF,
    Fleet,
    head_tx,
    ids,
    loading,
    make_image,
    nodekit_argv,
    push_argv,
    push_env,
    relay_dirs,
    wipe,
)

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]


def test_a_relay_chain_loads_every_node_and_the_head_sends_the_stream_once(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    dirs = relay_dirs(fleet.cluster)
    before = head_tx(h0)
    done = h0.run(*push_argv(fleet, h1, h2), env=push_env(fleet), timeout=300)
    sent = head_tx(h0) - before
    assert done.returncode == 0, done.stdout + done.stderr
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert "h1 -> h2 (relayed)" in done.stderr and "h2: loaded" in done.stderr and "relayed by h1" in done.stderr
    # One copy of the stream (plus SSH's framing and the survey's queries), not two.
    assert MIB << 20 < sent < 1.3 * (MIB << 20), f"the head's link sent {sent} bytes for one {MIB} MiB stream"
    # Nothing of the relay is left on the nodes: no temporary directory, no process.
    assert relay_dirs(fleet.cluster) == dirs
    assert not loading(h1) and not loading(h2)


def test_without_relay_the_head_sends_a_copy_per_node(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
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
    clean(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    dirs = relay_dirs(fleet.cluster)
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
    assert (
        "the relay tree did not deliver to every node: h1 failed" in err and "sending to h1, h2 from the head" in err
    ), err
    assert h2.image_id(REF) == want, err  # the node after the dead relay got the image from the head
    assert "h1" in err.splitlines()[-2] + err.splitlines()[-1], err  # the failure names the dead node
    assert not loading(h2), "a relay process was left running on h2"
    # Only the killed relay node's directory stays (SIGKILL runs no cleanup); h2, the last node, has none left.
    left = relay_dirs(fleet.cluster) - dirs
    assert all((d / "c0" / "known_hosts").is_file() for d in left) and len(left) <= 1, [
        sorted(os.listdir(d)) for d in left
    ]
    for d in left:
        shutil.rmtree(d)
    c.restart(h1)
    assert ids(h1) == set(), "the killed node kept a partial image"


def test_a_node_whose_host_key_the_head_lacks_is_not_relayed_to(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
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
    assert "h2: not in the relay tree (the head has no host key for" in done.stderr, done.stderr
    assert "relayed by" not in done.stderr


def clean(head: Host, *nodes: Host) -> None:
    """Every image gone from the nodes; on the head only this module's test image (the session's demo image, which
    later tests find on host 0, stays)."""
    wipe(*nodes)
    if head.image_id(REF):
        head.docker("rmi", "-f", REF)


def accepted(host: Host) -> int:
    """SSH logins host's sshd has accepted so far (its log, LogLevel INFO)."""
    log = host.sshd_dir / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey") if log.exists() else 0


def test_a_push_opens_one_ssh_connection_per_node_and_closes_it(fleet: Fleet) -> None:
    """Six docker calls per node (four survey questions, the load, the id check) share one SSH connection
    (nodekit/ship/mux.py); when the push ends no master connection is left and its directory is gone."""
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=4)
    before = {h.name: accepted(h) for h in (h1, h2)}
    # By the push's pid (nsenter execs it): another xdist worker's nodekit run has its own in the same /tmp.
    push = subprocess.Popen(h0.argv(*push_argv(fleet, h1, h2, relay="never")), env=h0.env(push_env(fleet)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    out, _ = push.communicate(timeout=300)
    assert push.returncode == 0, out
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert {h.name: accepted(h) - before[h.name] for h in (h1, h2)} == {"h1": 1, "h2": 1}
    mine = f"/tmp/nkssh.{push.pid}."
    masters = subprocess.run(["pgrep", "-f", f"ControlPath={mine}"], capture_output=True, text=True).stdout
    assert masters.strip() == "", f"SSH master connections left running: {masters}"
    assert list(Path("/tmp").glob(f"nkssh.{push.pid}.*")) == [], "this push left its mux directory"


# --- what a relay lends the nodes: nothing of the user's ---------------------------------------------------------


def relay_steps(host: Host) -> dict[int, dict[str, str]]:
    """The relay's processes running in ``host`` (its script, and the ssh it dials the next node with), each with
    its environment: what root on that node sees of them."""
    found = {}
    for pid in pids_in_netns(os.stat(host.netns_path).st_ino):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == b"nodekit-relay" or b"/nodekit-relay." in a for a in argv):
            pairs = (e.decode(errors="replace").partition("=") for e in environ if b"=" in e)
            found[pid] = {k: v for k, _, v in pairs}
    return found


def nodekit_lines(host: Host) -> list[str]:
    """The lines nodekit wrote into the login user's ~/.ssh/authorized_keys on ``host``."""
    keys = host.home / ".ssh" / "authorized_keys"
    text = keys.read_text() if keys.exists() else ""
    return [ln for ln in text.splitlines() if ln.endswith(" nodekit-relay")]


def test_a_relay_lends_the_nodes_no_key_of_the_users(fleet: Fleet, tmp_path: Path) -> None:
    """The user runs an ssh-agent holding the key every node accepts. Forwarded hop to hop (``ssh -A``), it would
    be named by SSH_AUTH_SOCK inside the relay step on a node, and root there could log in anywhere with it while
    the push ran. No relay process on any node has an agent, and the push's own hop keys are gone from every node
    when it ends."""
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
    want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    seen: dict[str, list[dict[str, str]]] = {"h1": [], "h2": []}
    tried: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.05)
        added = subprocess.run(["ssh-add", str(fleet.keys.client_key)], env={"SSH_AUTH_SOCK": str(sock)},
                               capture_output=True, text=True)  # fmt: skip
        assert added.returncode == 0, added.stderr
        sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))  # about 5 s of stream: time to look at the relay steps
        proc = subprocess.Popen(h0.argv(*push_argv(fleet, h1, h2)), env=h0.env({**push_env(fleet),
                                "SSH_AUTH_SOCK": str(sock)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            for h in (h1, h2):
                steps = relay_steps(h)
                seen[h.name] += steps.values()
                if steps and h.name not in tried:
                    # As root on the node would: an agent through the relay step's own environment.
                    env = next(iter(steps.values()))
                    tried[h.name] = h.run("ssh-add", "-l", env={"SSH_AUTH_SOCK": env.get("SSH_AUTH_SOCK", "")})
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
        agent.terminate()
        agent.wait(timeout=10)
    assert proc.returncode == 0, out + err
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert "relayed by h1" in err, err
    assert seen["h1"] and seen["h2"] and set(tried) == {"h1", "h2"}, "the relay steps were never seen running"
    for name, envs in seen.items():
        socks = {e["SSH_AUTH_SOCK"] for e in envs if e.get("SSH_AUTH_SOCK")}
        assert not socks, f"the relay on {name} had the user's agent: {socks}"
    for name, got in tried.items():
        assert got.returncode != 0 and "ED25519" not in got.stdout, f"{name}: {got.stdout}{got.stderr}"
    assert nodekit_lines(h1) == [] and nodekit_lines(h2) == []
    assert not list(Path("/tmp").glob("nodekit-agent.*")), "nodekit started an agent of its own"


def test_two_pushes_at_once_to_the_same_nodes_both_relay_and_leave_no_key(fleet: Fleet) -> None:
    """Two pushes of two images to h1 and h2 at the same moment: each sets up its own hop key and directories and,
    ending, removes only its own line (found by its key, under flock; tests/unit/ship/test_hopkeys.py checks the
    interleaving itself): both chains deliver, and neither push's line is left."""
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
    other = "nodekit/shiptest:other"
    want = {REF: make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB),
            other: make_image(h0, other, seed=random.randrange(1 << 30), mib=MIB)}  # fmt: skip
    dirs = relay_dirs(fleet.cluster)
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 80))  # both streams still flowing when the other one ends
    try:
        pushes = {}
        for ref in want:
            argv = nodekit_argv("push", ref, "--to", f"h1={fleet.url(h1)}", "--to", f"h2={fleet.url(h2)}", "--relay",
                                "always")  # fmt: skip
            pushes[ref] = subprocess.Popen(h0.argv(*argv), env=h0.env(push_env(fleet)), stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)  # fmt: skip
        done = {ref: p.communicate(timeout=300) for ref, p in pushes.items()}
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
    for ref, (out, err) in done.items():
        assert pushes[ref].returncode == 0 and "relayed by h1" in err, out + err
        assert h1.image_id(ref) == want[ref] and h2.image_id(ref) == want[ref]
    assert nodekit_lines(h1) == [] and nodekit_lines(h2) == []
    assert relay_dirs(fleet.cluster) == dirs


ACCESS_SCRIPT = """
import json, sys
from nodekit.ship import dial, relay
from nodekit.ship.access import TreeAccess
hops = [dial.hop_of(f"h{i}", url) for i, url in enumerate(sys.argv[2:], 1)]
access = TreeAccess(hops, relay.RELAY_SCRIPT, lifetime_s=int(sys.argv[1]))
access.open()
print(json.dumps({h.name: [access.prepared[h.name].dir, ""] for h in hops}), flush=True)
sys.stdin.read()
access.close()
print("closed", flush=True)
"""


def test_a_hop_key_runs_only_the_relay_step_only_from_the_node_before_and_expires(fleet: Fleet) -> None:
    """nodekit's own setup (nodekit.ship.access.TreeAccess) against real sshd: the key h1 made for the hop to h2 is
    accepted by h2 from h1's address only, runs h2's relay step whatever command is asked for, and is refused once its
    expiry-time has passed, even while its line is still there (a push whose head died)."""
    h0, h1, h2 = fleet.cluster.hosts
    life = 12
    with chain_access(fleet, life) as dirs:
        opened = time.time()
        key = Path(dirs["h1"]) / "c0" / "key"  # made on h1 (the hosts share this machine's /tmp)
        [line] = nodekit_lines(h2)
        assert nodekit_lines(h1) == []
        assert f'restrict,from="{h1.addr}",command="{hopkeys.entry_command(dirs["h2"])}" ssh-ed25519 ' in line, line
        stamp = re.match(r'expiry-time="(\d{14})",', line)
        assert stamp is not None, line
        expires = time.mktime(time.strptime(stamp.group(1), "%Y%m%d%H%M%S"))
        assert opened - 5 <= expires - life <= opened + 1, (line, opened)

        def login(frm: Host) -> subprocess.CompletedProcess[str]:
            return hop_login(frm, h2, key, "echo ASKED; id")

        refused = login(h0)  # another address than h1's
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
        ran = login(h1)  # h1's address: the relay step runs (here with nothing to load), not the command asked
        assert "ASKED" not in ran.stdout and "uid=" not in ran.stdout, ran.stdout
        name = base64.b64encode(b"h2").decode()
        assert f"nodekit-relay load {name} " in ran.stderr, ran.stderr
        assert nodekit_lines(h2) == [], "the relay step left its line behind"
        put_back(h2, line)  # as after a step SIGKILLed before its exit trap: the line still there, past its expiry
        time.sleep(max(0.0, expires + 2 - time.time()))
        late = login(h1)
        assert late.returncode == 255 and "Permission denied" in late.stderr, late.stderr
    assert nodekit_lines(h1) == [] and nodekit_lines(h2) == []
    assert not any(Path(d).exists() for d in dirs.values())


KILLED_SCRIPT = """
import sys
from nodekit import ship
from nodekit.system.progress import NullReporter
from nodekit.ship import hopkeys
hopkeys.KEY_LIFETIME_S = int(sys.argv[1])
src = ship.source_of(sys.argv[2], None)
targets = [ship.Target(f"h{i}", url) for i, url in enumerate(sys.argv[3:], 1)]
with ship.SharedSsh():
    ship.push(ship.plan_push(src, ship.survey(src, targets)), NullReporter(), relay="always")
"""


def test_a_killed_push_leaves_no_line_the_relay_steps_remove_their_own(fleet: Fleet) -> None:
    """SIGKILL to the head mid-stream: the relay steps end with the stream, and none leaves its hop key's line (issue
    28: before, h2's line stayed until its expiry, pointing at a directory that was gone, which another local user
    could make again). h2's step removed its line as it started (a hop key runs one relay step), while the stream
    still flowed; the next push goes through."""
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
    make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    dirs = relay_dirs(fleet.cluster)
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))
    try:
        head = subprocess.Popen(h0.argv(sys.executable, "-c", KILLED_SCRIPT, "300", REF, fleet.url(h1),
                                        fleet.url(h2)), env=h0.env(push_env(fleet)), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while not (loading(h1) and loading(h2)):
            assert head.poll() is None and time.monotonic() < deadline, "the relay never reached h2"
            time.sleep(0.1)
        assert nodekit_lines(h2) == [], "h2's relay step runs and its hop key is still accepted"
        head.kill()  # nsenter execs python: this is the head itself
        head.wait(timeout=10)
        deadline = time.monotonic() + 60
        while loading(h1) or loading(h2) or relay_steps(h1) or relay_steps(h2):
            assert time.monotonic() < deadline, "the relay outlived its head"
            time.sleep(0.2)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
    assert nodekit_lines(h1) == [] and nodekit_lines(h2) == []
    assert relay_dirs(fleet.cluster) == dirs
    wipe(h1, h2)
    done = h0.run(*push_argv(fleet, h1, h2), env=push_env(fleet), timeout=300)
    assert done.returncode == 0 and "relayed by h1" in done.stderr, done.stdout + done.stderr
    assert nodekit_lines(h1) == [] and nodekit_lines(h2) == []


@contextlib.contextmanager
def chain_access(fleet: Fleet, life: int) -> Iterator[dict[str, str]]:
    """nodekit's own setup of the chain h1 -> h2 (ACCESS_SCRIPT, from the head), each node's relay directory by
    name; closed (and checked closed) when the block ends."""
    h0, h1, h2 = fleet.cluster.hosts
    setup = subprocess.Popen(h0.argv(sys.executable, "-c", ACCESS_SCRIPT, str(life), fleet.url(h1), fleet.url(h2)),
                             env=h0.env(push_env(fleet)), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert setup.stdout is not None and setup.stdin is not None
        first = setup.stdout.readline()
        assert first, setup.communicate(timeout=30)
        yield {name: d for name, (d, _) in json.loads(first).items()}
        out, err = setup.communicate("", timeout=60)
        assert "closed" in out, out + err
    finally:
        if setup.poll() is None:
            setup.kill()
            setup.wait()


def put_back(host: Host, line: str) -> None:
    """``line`` into the login user's authorized_keys on ``host`` again."""
    keys = host.home / ".ssh" / "authorized_keys"
    keys.write_text(keys.read_text() + line + "\n")


def hop_login(frm: Host, to: Host, key: Path, command: str = "true") -> subprocess.CompletedProcess[str]:
    """ssh from ``frm`` to ``to`` with ``key`` alone, as a relay hop would (or root on ``frm`` holding it)."""
    return frm.run("ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
                   "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                   "-o", "ConnectTimeout=5", f"root@{to.addr}", command, timeout=60)  # fmt: skip


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def test_another_local_user_cannot_make_a_hop_key_run_their_file(fleet: Fleet) -> None:
    """Issue 28, as found: the relay step's exit removed its directory in /tmp, the line naming it stayed, and an
    unprivileged user on h2 made the directory again with a relay of their own, which the next login with h1's hop
    key ran as root. Now the step removes its line first (the login is refused), and a line that does stay (a step
    SIGKILLed, a head that died) runs nothing from a directory that is not the login user's own, mode 0700."""
    _, h1, h2 = fleet.cluster.hosts
    marker = Path(f"/tmp/nodekit-takeover-{os.getpid()}")  # what the planted relay writes: the uid it ran as
    marker.unlink(missing_ok=True)
    planted: Path | None = None
    try:
        with chain_access(fleet, 300) as dirs:
            key = Path(dirs["h1"]) / "c0" / "key"
            [line] = nodekit_lines(h2)
            ran = hop_login(h1, h2, key)  # the chain's one hop: h2's relay step runs, with nothing to load, and ends
            assert "nodekit-relay load" in ran.stderr, ran.stderr
            planted = Path(dirs["h2"])
            assert not planted.exists()
            plant = f'mkdir -m 700 {planted} && printf "id -u > {marker}\\n" > {planted}/relay'
            made = h2.run(*NOBODY, "sh", "-c", plant)
            assert made.returncode == 0, made.stderr
            again = hop_login(h1, h2, key)
            assert not marker.exists(), f"the hop key ran another user's file, as uid {marker.read_text().strip()}"
            assert again.returncode == 255 and "Permission denied" in again.stderr, again.stderr
            put_back(h2, line)  # as a step SIGKILLed before its exit trap leaves it
            kept = hop_login(h1, h2, key)
            assert not marker.exists(), f"the hop key ran another user's file, as uid {marker.read_text().strip()}"
            assert kept.returncode == 126 and "is not a mode 0700 directory of this user" in kept.stderr, kept.stderr
    finally:
        if planted is not None:
            shutil.rmtree(planted, ignore_errors=True)
        marker.unlink(missing_ok=True)
    assert nodekit_lines(h2) == []


def hop_session(frm: Host, to: Host, key: Path) -> subprocess.Popen[str]:
    """:func:`hop_login`, its stream held open until the test closes its stdin."""
    return subprocess.Popen(frm.argv("ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o",
                                     "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                                     "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
                                     f"root@{to.addr}", "true"), env=frm.env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_two_logins_with_one_hop_key_get_one_relay_step_and_nothing_goes_through_planted_links(fleet: Fleet) -> None:
    """Review N1, against real sshd: root on h1 logs in to h2 twice with h1's hop key, both streams held open (A,
    then B). A ends, and its cleanup removes the line and h2's relay directory; an unprivileged user on h2 makes the
    directory again with an ``rc`` link to a file in a root-only directory and an ``out`` link to a root-only file;
    then B ends. A hop key runs one relay step: B is refused (by sshd, the line being gone once A's step started,
    or by the step), writes nothing through ``rc`` and sends nothing of what ``out`` points at back to h1 (before,
    B ran as root beside A, wrote its exit code through ``rc`` and sent the root-only file's last lines on stderr)."""
    _, h1, h2 = fleet.cluster.hosts
    victim = Path(f"/tmp/nodekit-victim-{os.getpid()}")
    shutil.rmtree(victim, ignore_errors=True)
    victim.mkdir(mode=0o711)
    shadow = victim / "shadow"
    secret = "root:$6$FAKEHASH:19000:0:99999:7:::\nalice:$6$ALICEHASH:19000:0:99999:7:::\n"
    shadow.write_text(secret)
    shadow.chmod(0o640)
    a: subprocess.Popen[str] | None = None
    b: subprocess.Popen[str] | None = None
    planted: Path | None = None
    try:
        with chain_access(fleet, 300) as dirs:
            key, here = Path(dirs["h1"]) / "c0" / "key", Path(dirs["h2"])
            a = hop_session(h1, h2, key)
            deadline = time.monotonic() + 60
            while not (here / "pgid").exists():  # A's relay step runs (its docker load waits for the stream)
                assert a.poll() is None and time.monotonic() < deadline, "A's relay step never started"
                time.sleep(0.1)
            b = hop_session(h1, h2, key)
            deadline = time.monotonic() + 60
            while b.poll() is None and len(docker_loads(h2)) < 2:
                assert time.monotonic() < deadline, "B was neither refused nor started its relay step"
                time.sleep(0.1)
            a.communicate("", timeout=60)
            assert not here.exists(), "A's relay step left its directory"
            planted = here
            plant = f"mkdir -m 700 {here} && ln -s {victim}/target {here}/rc && ln -s {shadow} {here}/out"
            made = h2.run(*NOBODY, "sh", "-c", plant)
            assert made.returncode == 0, made.stderr
            _, said = b.communicate("", timeout=60)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if planted is not None:
            shutil.rmtree(planted, ignore_errors=True)
        target = (victim / "target").exists()
        leaked = shadow.read_text() != secret
        shutil.rmtree(victim, ignore_errors=True)
    assert not target, f"the second login wrote, as root, through a link another user planted: {said}"
    assert not leaked
    decoded = said + repr(parse_report(said).loads)
    assert "FAKEHASH" not in decoded and "ALICEHASH" not in decoded, f"a root-only file reached the key holder: {said}"
    assert b.returncode == 255 and "Permission denied" in said, said  # the line went when A's step started
    assert nodekit_lines(h2) == []


STALL_SCRIPT = """
import sys
from nodekit import ship
from nodekit.errors import NodekitError
from nodekit.system.progress import NullReporter
src = ship.source_of(sys.argv[1], None)
targets = [ship.Target(f"h{i}", url) for i, url in enumerate(sys.argv[2:], 1)]
with ship.SharedSsh():
    try:
        ship.push(ship.plan_push(src, ship.survey(src, targets)), NullReporter(), relay="always", stall_s=3)
    except NodekitError as e:
        print(e.one_line())
"""


def test_a_node_lying_about_process_groups_cannot_make_the_head_kill_on_another(fleet: Fleet) -> None:
    """Root on h1 writes, on its relay's stderr, that h2's relay runs as the process group of a bystander on h2.
    When the push is cut (here: h1 stops reading, the stall deadline passes), the head ends on each node only what
    that node's own relay step recorded there, never a process group the chain's stderr names: the bystander
    lives."""
    h0, h1, h2 = fleet.cluster.hosts
    clean(h0, h1, h2)
    make_image(h0, REF, seed=random.randrange(1 << 30), mib=MIB)
    bystander = subprocess.Popen(h2.argv("sleep", "600"), start_new_session=True)  # its own process group
    h2_name = base64.b64encode(b"h2").decode()
    rc = h1.home / ".ssh" / "rc"  # run by h1's sshd for every session of the user's (sshd(8), SSHRC)
    rc.write_text(f'( sleep 2; echo "nodekit-relay pgid {h2_name} {bystander.pid}" >&2 ) &\n')
    stopped: list[int] = []
    sh("tc", "-n", h0.netns, *tbf_argv(h0.iface, 40))
    try:
        head = subprocess.Popen(h0.argv(sys.executable, "-c", STALL_SCRIPT, REF, fleet.url(h1), fleet.url(h2)),
                                env=h0.env(push_env(fleet)), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not (loading(h1) and loading(h2)):
            assert head.poll() is None and time.monotonic() < deadline, "the relay never reached h2"
            time.sleep(0.1)
        stopped = docker_loads(h1)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)  # h1 stops taking the stream: the head cuts the chain after 3 s
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
        out, err = head.communicate(timeout=300)
    finally:
        sh("tc", "-n", h0.netns, "qdisc", "del", "dev", h0.iface, "root", check=False)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        rc.unlink()
        alive = bystander.poll() is None
        bystander.kill()
        bystander.wait()
    assert alive, f"the head killed a process group on h2 that h1 named: {out}{err}"
    deadline = time.monotonic() + 30
    while loading(h1) or loading(h2) or relay_steps(h1) or relay_steps(h2):
        assert time.monotonic() < deadline, "a relay step outlived the cut chain"
        time.sleep(0.2)
    assert nodekit_lines(h1) == [] and nodekit_lines(h2) == []


def docker_loads(host: Host) -> list[int]:
    """The ``docker load`` processes running in ``host``."""
    found = []
    for pid in pids_in_netns(os.stat(host.netns_path).st_ino):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"load" in argv and any(a.endswith(b"docker") for a in argv):
                found.append(pid)
    return found
