"""The relay chain's parts that need no node: its script, what its nodes report, and what the head's own OpenSSH
(``ssh -G``, ``ssh-keygen -F``: real commands, no network) says about dialing each node. The per-push keys:
tests/unit/ship/test_hopkeys.py."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from nodekit.ship import hopkeys, relay
from nodekit.ship.dial import hop_of, host_key_name, known_lines
from nodekit.ship.hopkeys import Hop
from nodekit.ship.relay import RELAY_SCRIPT, parse_report, why_not_loaded
from nodekit.ship.tree import plan_tree

needs_ssh = pytest.mark.skipif(
    shutil.which("ssh") is None or shutil.which("ssh-keygen") is None, reason="no OpenSSH client here"
)


def hop(name: str, **kw: object) -> Hop:
    fields: dict[str, object] = dict(name=name, endpoint=f"ssh://root@{name}", user="root", hostname=name, port=22,
                                     alias=name, known_hosts=f"{name} ssh-ed25519 AAAA\n")  # fmt: skip
    fields.update(kw)
    return Hop(**fields)  # type: ignore[arg-type]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_setup_carries_the_script_and_each_node_it_feeds_without_quoting() -> None:
    hops = [hop("a"), hop("b b", user="", port=2222, alias="[b b]:2222"), hop("c'; rm -rf /")]
    cmd = hopkeys.setup_command(hops[1], hops[2:], RELAY_SCRIPT)
    words = cmd.split(" ")
    assert words[:4] == ["sh", "-c", '"$(printf', "%s"] and words[5:8] == ["|", "base64", '-d)"']
    assert base64.b64decode(words[4]).decode() == hopkeys.SETUP_SCRIPT and words[8] == "nodekit-relay-setup"
    args = words[9:]
    assert base64.b64decode(args[0]).decode() == "b b" and base64.b64decode(args[1]).decode() == RELAY_SCRIPT
    # Six words per node it feeds, each base64 or digits: a name with spaces or quotes cannot break the line.
    assert len(args) == 8 and args[4] == "22"
    assert base64.b64decode(args[2]).decode() == "c'; rm -rf /"
    assert all(w.isdigit() or set(w) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
               for w in args)  # fmt: skip
    assert len(hopkeys.setup_command(hops[2], [], RELAY_SCRIPT).split(" ")[9:]) == 2  # a leaf: it feeds nobody
    assert len(hopkeys.setup_command(hops[0], hops[1:], RELAY_SCRIPT).split(" ")[9:]) == 2 + 2 * 6


def test_the_script_is_posix_sh() -> None:
    sh = shutil.which("dash") or shutil.which("sh")
    assert sh is not None
    for script in (RELAY_SCRIPT, hopkeys.SETUP_SCRIPT, hopkeys.AUTHORIZE_SCRIPT, hopkeys.END_SCRIPT):
        assert subprocess.run([sh, "-n", "-c", script], capture_output=True).returncode == 0, script


def test_reports_are_read_per_node_and_failures_explained() -> None:
    hops = [hop("a"), hop("b"), hop("c"), hop("d")]  # a feeds b and c, b feeds d
    stderr = "\n".join([
        f"nodekit-relay load {b64('a')} 0 {b64('Loaded image ID: sha256:ab')}",
        f"nodekit-relay load {b64('c')} 0 {b64('Loaded image ID: sha256:ab')}",
        "Host key verification failed.",
        f"nodekit-relay hop {b64('b')} 255",
        f"nodekit-relay hop {b64('c')} 0",
    ])  # fmt: skip
    r = parse_report(stderr)
    assert r.loads == {"a": (0, "Loaded image ID: sha256:ab"), "c": (0, "Loaded image ID: sha256:ab")}
    assert r.hops == {"b": 255, "c": 0}
    why = why_not_loaded(hops, r, head_rc=0)
    assert set(why) == {"b", "d"}  # c, b's sibling, loaded: a failed hop cuts only its own subtree
    assert why["b"] == "a could not ssh to it: Host key verification failed."
    assert why["d"] == "the stream from b stopped before it reached it"
    chain = why_not_loaded(hops, r, head_rc=0, tree=plan_tree(4, fanout=1))  # a -> b -> c -> d
    assert chain["d"] == "the stream from c stopped before it reached it" and set(chain) == {"b", "d"}
    failed = parse_report(f"nodekit-relay load {b64('a')} 1 {b64('unexpected EOF')}")
    assert why_not_loaded(hops[:1], failed, 0) == {"a": "docker load there failed (exit 1): unexpected EOF"}
    assert why_not_loaded(hops[:1], parse_report("Connection refused"), 255) == {
        "a": "its SSH session ended (exit 255): Connection refused"
    }


def test_host_key_names_follow_openssh() -> None:
    assert host_key_name("10.0.0.5", 22, None) == "10.0.0.5"
    assert host_key_name("10.0.0.5", 2222, None) == "[10.0.0.5]:2222"
    assert host_key_name("10.0.0.5", 2222, "node5") == "node5"
    assert known_lines("# Host x found: line 3\nx ssh-ed25519 AAAA\n\n") == "x ssh-ed25519 AAAA\n"


@needs_ssh
def test_a_hop_is_what_the_heads_ssh_config_and_known_hosts_say(tmp_path: Path) -> None:
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    pub = key.with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.9.9.9]:2222 {pub[0]} {pub[1]}\nother {pub[0]} {pub[1]}\n")
    config = tmp_path / "config"
    config.write_text(
        f"Host node5\n  HostName 10.9.9.9\n  Port 2222\n  User alice\n  IdentityFile {key}\n"
        f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
        f"Host jumped\n  ProxyJump node5\n  UserKnownHostsFile {known}\n"
        f"Host unknown\n  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    got = hop_of("n5", "ssh://node5", env)
    assert isinstance(got, Hop), got
    assert (got.dest, got.port, got.alias) == ("alice@10.9.9.9", 2222, "[10.9.9.9]:2222")
    assert got.known_hosts == f"[10.9.9.9]:2222 {pub[0]} {pub[1]}\n"  # only that host's line travels
    assert hop_of("n6", "ssh://jumped", env) == "reached through proxyjump (its node may not reach it directly)"
    missing = hop_of("n7", "ssh://unknown", env)
    assert isinstance(missing, str) and missing.startswith("the head has no host key for unknown")
    assert hop_of("n8", "tcp://10.0.0.1:2376", env) == "not an ssh:// endpoint"


def test_only_ssh_targets_sharing_a_big_enough_stream_relay() -> None:
    from nodekit import ship

    big = ship.Source(ref="nodekit/demo:abc", image_id="sha256:" + "a" * 64, size=2 << 30, engine_id="src")
    small = ship.Source(ref="nodekit/demo:abc", image_id="sha256:" + "a" * 64, size=1 << 20, engine_id="src")

    def st(name: str, endpoint: str) -> ship.TargetState:
        return ship.TargetState(target=ship.Target(name, endpoint), engine_id=f"e-{name}", free_bytes=1 << 40)

    states = [st("n1", "ssh://me@n1"), st("t", "tcp://t:2376"), st("n2", "ssh://me@n2"), st("n3", "ssh://me@n3")]
    plan = ship.plan_push(big, states)
    assert ship.relay_text(plan, "auto") == [
        "  relayed: 3 nodes in one tree, each passing the stream on while it loads it; the head's link carries 2 "
        "copies of this stream (one for the tree, one per target fed directly: 1); a node whose host key the head "
        "lacks is fed directly",
        "    the head feeds n1",
        "    n1 feeds n2, n3",
        "    3 nodes, at most 2 fed by each, 2 hop(s) deep; 1 copy of the stream on the head's link",
    ]
    assert ship.relay_text(plan, "never") == []
    tiny = ship.plan_push(small, states)
    assert ship.relay_text(tiny, "auto") == []  # a code change's few KiB: the hops' handshakes would cost more
    assert len(ship.relay_text(tiny, "always")) == 4
    one = ship.plan_push(big, states[:2])
    assert ship.relay_candidates(one.loads(), big.size, "always") == []  # one ssh target: nothing to relay to


def test_a_process_group_a_node_names_on_stderr_is_only_text() -> None:
    """A line ``nodekit-relay pgid NODE N`` on the chain's stderr (which any node can write, for any node) is text:
    the report has no such field, so nothing on it can tell the head to kill process group N on NODE."""
    r = parse_report(f"nodekit-relay pgid {b64('b')} 4242\nnodekit-relay load {b64('a')} 0 {b64('ok')}")
    assert r.loads == {"a": (0, "ok")} and not hasattr(r, "pgids")
    assert r.other == [f"nodekit-relay pgid {b64('b')} 4242"]


def test_the_dry_run_shows_one_tree_and_one_copy_on_the_heads_link_for_sixteen_nodes() -> None:
    from nodekit import ship

    big = ship.Source(ref="nodekit/demo:abc", image_id="sha256:" + "a" * 64, size=2 << 30, engine_id="src")
    states = [ship.TargetState(target=ship.Target(f"n{i}", f"ssh://me@n{i}"), engine_id=f"e{i}", free_bytes=1 << 40)
              for i in range(16)]  # fmt: skip
    lines = ship.relay_text(ship.plan_push(big, states), "auto")
    assert lines[0].startswith("  relayed: 16 nodes in one tree") and "carries 1 copy of this stream;" in lines[0]
    assert lines[1:4] == ["    the head feeds n0", "    n0 feeds n1, n2", "    n1 feeds n3, n4"]
    assert lines[-2:] == [
        "    n7 feeds n15",
        "    16 nodes, at most 2 fed by each, 5 hop(s) deep; 1 copy of the stream on the head's link",
    ]


def test_a_first_node_that_floods_its_stderr_cannot_make_the_head_hold_it_and_the_reports_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head reads the chain's stderr, which the first node (root there) can fill without end: 32 MiB here, many
    lines and then one long line without an end, between the nodes' report lines. The head holds a bounded amount
    however much comes (the peak of what Python allocated while it read), and still reads every report line."""
    from nodekit.ship import access, relay

    ok_a, ok_b = b64("Loaded image ID: sha256:aa"), b64("Loaded image ID: sha256:bb")
    first = (f"cat > /dev/null; echo 'nodekit-relay load {b64('a')} 0 {ok_a}' >&2; "
             f"yes 'junk from a compromised node' | head -c {24 << 20} >&2; "
             f"head -c {8 << 20} /dev/zero | tr '\\0' x >&2; echo >&2; "
             f"echo 'nodekit-relay load {b64('b')} 0 {ok_b}' >&2; echo 'nodekit-relay hop {b64('b')} 0' >&2; "
             "echo 'the last words' >&2")  # fmt: skip
    monkeypatch.setattr(access.TreeAccess, "open", lambda self: "the first node's relay step")
    monkeypatch.setattr(access.TreeAccess, "close", lambda self, kill=False: None)
    monkeypatch.setattr(relay, "node_argv", lambda hop, command, keepalive=False: ["sh", "-c", first])
    tracemalloc.start()
    try:
        sink = relay.RelaySink([hop("a"), hop("b")])
        sink.write(b"the stream")
        got = sink.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"the head held {peak >> 20} MiB of a first node's stderr"
    assert got.loads == {"a": (0, "Loaded image ID: sha256:aa"), "b": (0, "Loaded image ID: sha256:bb")}
    assert got.hops == {"b": 0} and got.other[-1] == "the last words"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen here")
def test_a_node_feeds_each_of_its_children_and_one_that_dies_stops_neither_its_load_nor_its_sibling(
    tmp_path: Path,
) -> None:
    """The relay step of a node that feeds two others, run by sh as sshd runs it, set up by the real setup script;
    its ``ssh`` and ``docker`` are stand-ins on PATH (real sshd: tests/cluster/test_tree.py). The hop to the second
    child fails at once without reading (as an ssh to a dead node does): the node's own load and the first child
    still get the whole stream, and the node reports each hop's end."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(f"#!/bin/sh\ncat > {tmp_path}/loaded\necho 'Loaded image ID: sha256:ab'\n")
    (fake / "ssh").write_text(
        "#!/bin/sh\nfor a; do dest=$prev; prev=$a; done\n"
        '[ "$dest" = root@127.0.0.2 ] && { echo "ssh: connect to host 127.0.0.2: No route to host" >&2; exit 255; }\n'
        f'cat > "{tmp_path}/got-$dest"\necho "nodekit-relay load {b64("live")} 0 {b64("ok")}" >&2\n'
    )
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{fake}:{os.environ['PATH']}", "SSH_CONNECTION": "10.9.0.1 4 10.9.0.2 22"}
    setup = hopkeys.setup_command(hop("me"), [hop("live", hostname="127.0.0.1"), hop("dead", hostname="127.0.0.2")],
                                  RELAY_SCRIPT)  # fmt: skip
    done = subprocess.run(["sh", "-c", setup], env=env, capture_output=True, text=True, timeout=30)
    got = hopkeys.parse_setup(done.stdout, feeds=2)
    assert isinstance(got, hopkeys.Prepared), done.stdout + done.stderr
    stream = os.urandom(4 << 20)  # far more than a pipe holds: a child that never reads must not hold the node up
    ran = subprocess.run(["sh", "-c", hopkeys.entry_command(got.dir)], input=stream, env=env, capture_output=True,
                         timeout=60)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "loaded").read_bytes() == stream
    assert (tmp_path / "got-root@127.0.0.1").read_bytes() == stream
    report = parse_report(ran.stderr.decode())
    assert report.loads == {"me": (0, "Loaded image ID: sha256:ab"), "live": (0, "ok")}
    assert report.hops == {"live": 0, "dead": 255}
    assert why_not_loaded([hop("me"), hop("live"), hop("dead")], report, 0) == {
        "dead": "me could not ssh to it: ssh: connect to host 127.0.0.2: No route to host"
    }
    assert not Path(got.dir).exists()  # nothing left on the node


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen here")
def test_a_node_whose_engine_hangs_cuts_off_its_own_load_and_still_feeds_the_node_below_it(tmp_path: Path) -> None:
    """The node's own ``docker load`` takes nothing (a hung engine; a stand-in that never reads): after the load's
    stall deadline (2 s here) the node ends that load, names why, and the node it feeds still gets the whole stream,
    instead of the node, and every node above it, waiting until the head cuts the whole tree."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text("#!/bin/sh\nexec sleep 600\n")
    (fake / "ssh").write_text(f'#!/bin/sh\ncat > "{tmp_path}/got"\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{fake}:{os.environ['PATH']}", "SSH_CONNECTION": "10.9.0.1 4 10.9.0.2 22"}
    setup = hopkeys.setup_command(hop("me"), [hop("below", hostname="127.0.0.1")], relay.relay_script("gzip",
                                  load_stall_s=2))  # fmt: skip
    done = subprocess.run(["sh", "-c", setup], env=env, capture_output=True, text=True, timeout=30)
    got = hopkeys.parse_setup(done.stdout, feeds=1)
    assert isinstance(got, hopkeys.Prepared), done.stdout + done.stderr
    stream = os.urandom(4 << 20)
    ran = subprocess.run(["sh", "-c", hopkeys.entry_command(got.dir)], input=stream, env=env, capture_output=True,
                         timeout=60)  # fmt: skip
    assert (tmp_path / "got").read_bytes() == stream
    why = why_not_loaded([hop("me"), hop("below")], parse_report(ran.stderr.decode()), 0)
    assert why["me"].startswith("docker load there failed (exit 143): nodekit-relay: docker load here took nothing "
                                "for 2 s: cut off"), why  # fmt: skip
    assert not Path(got.dir).exists()


def test_a_tree_whose_root_stops_reading_is_cut_on_every_node_after_the_sinks_one_stall_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head's session to the root takes nothing (a node or a link below hangs, and every tee above it blocks):
    a write that blocks for the sink's stall deadline (1 s here) cuts the head's session and, on every node, the
    relay step (``close(kill=True)``), and raises ShipError naming the root and the deadline. Images and datasets
    both feed a tree through this one sink, so this is their one stall deadline."""
    import threading

    from nodekit.errors import ShipError
    from nodekit.ship import access

    closed: list[bool] = []
    monkeypatch.setattr(access.TreeAccess, "open", lambda self: "the first node's relay step")
    monkeypatch.setattr(access.TreeAccess, "close", lambda self, kill=False: closed.append(kill))
    monkeypatch.setattr(relay, "node_argv", lambda hop, command, keepalive=False: ["sleep", "600"])
    sink = relay.RelaySink([hop("a"), hop("b")], stall_s=1)
    raised: list[BaseException] = []

    def feed() -> None:
        try:
            for _ in range(1024):  # 64 MiB: far more than a pipe holds
                sink.write(b"x" * (64 << 10))
        except BaseException as e:
            raised.append(e)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    feeder.join(timeout=20)
    if feeder.is_alive():
        sink.abort()
        pytest.fail("a write into a root that reads nothing blocked past 20 s")
    (e,) = raised
    assert isinstance(e, ShipError) and e.node == "a", e
    assert e.message.startswith("the relay tree from a took nothing for 1 s"), e.message
    assert closed and closed[0] is True  # the relay steps on the nodes were ended, not left blocked
