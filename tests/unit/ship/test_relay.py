"""The relay chain's parts that need no node: its script, what its nodes report, and what the head's own OpenSSH
(``ssh -G``, ``ssh-keygen -F``: real commands, no network) says about dialing each node. The per-push keys:
tests/unit/ship/test_hopkeys.py."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from nodekit.ship import hopkeys
from nodekit.ship.relay import RELAY_SCRIPT, Hop, hop_of, host_key_name, known_lines, parse_report, why_not_loaded

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


def test_setup_carries_the_script_and_the_next_hop_without_quoting() -> None:
    hops = [hop("a"), hop("b b", user="", port=2222, alias="[b b]:2222"), hop("c'; rm -rf /")]
    cmd = hopkeys.setup_command(hops[1], hops[2], RELAY_SCRIPT)
    words = cmd.split(" ")
    assert words[:4] == ["sh", "-c", '"$(printf', "%s"] and words[5:8] == ["|", "base64", '-d)"']
    assert base64.b64decode(words[4]).decode() == hopkeys.SETUP_SCRIPT and words[8] == "nodekit-relay-setup"
    args = words[9:]
    assert base64.b64decode(args[0]).decode() == "b b" and base64.b64decode(args[1]).decode() == RELAY_SCRIPT
    # Six words for the next hop, each base64 or digits: a name with spaces or quotes cannot break the line.
    assert len(args) == 8 and args[4] == "22"
    assert base64.b64decode(args[2]).decode() == "c'; rm -rf /"
    assert all(w.isdigit() or set(w) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
               for w in args)  # fmt: skip
    assert len(hopkeys.setup_command(hops[2], None, RELAY_SCRIPT).split(" ")[9:]) == 2  # the last node: no next


def test_the_script_is_posix_sh() -> None:
    sh = shutil.which("dash") or shutil.which("sh")
    assert sh is not None
    for script in (RELAY_SCRIPT, hopkeys.SETUP_SCRIPT, hopkeys.AUTHORIZE_SCRIPT, hopkeys.END_SCRIPT):
        assert subprocess.run([sh, "-n", "-c", script], capture_output=True).returncode == 0, script


def test_reports_are_read_per_node_and_failures_explained() -> None:
    hops = [hop("a"), hop("b"), hop("c")]
    stderr = "\n".join([
        f"nodekit-relay load {b64('a')} 0 {b64('Loaded image ID: sha256:ab')}",
        "Host key verification failed.",
        f"nodekit-relay hop {b64('b')} 255",
    ])  # fmt: skip
    r = parse_report(stderr)
    assert r.loads == {"a": (0, "Loaded image ID: sha256:ab")} and r.hops == {"b": 255}
    why = why_not_loaded(hops, r, head_rc=0)
    assert set(why) == {"b", "c"}
    assert why["b"] == "a could not ssh to it: Host key verification failed."
    assert why["c"] == "the stream from b stopped before it reached it"
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
        "  relayed: n1 -> n2 -> n3 (each passes the stream on; the head sends it once; a node whose host key the "
        "head lacks is fed directly)"
    ]
    assert ship.relay_text(plan, "never") == []
    tiny = ship.plan_push(small, states)
    assert ship.relay_text(tiny, "auto") == []  # a code change's few KiB: the hops' handshakes would cost more
    assert len(ship.relay_text(tiny, "always")) == 1
    one = ship.plan_push(big, states[:2])
    assert ship.relay_candidates(one.loads(), big.size, "always") == []  # one ssh target: nothing to relay to


def test_a_process_group_a_node_names_on_stderr_is_only_text() -> None:
    """A line ``nodekit-relay pgid NODE N`` on the chain's stderr (which any node can write, for any node) is text:
    the report has no such field, so nothing on it can tell the head to kill process group N on NODE."""
    r = parse_report(f"nodekit-relay pgid {b64('b')} 4242\nnodekit-relay load {b64('a')} 0 {b64('ok')}")
    assert r.loads == {"a": (0, "ok")} and not hasattr(r, "pgids")
    assert r.other == [f"nodekit-relay pgid {b64('b')} 4242"]


def test_many_nodes_make_several_even_chains_of_at_most_eight() -> None:
    from nodekit.ship.relay import CHAIN_MAX, split_chains

    assert CHAIN_MAX == 8
    sizes = {n: [len(r) for r in split_chains(n)] for n in (0, 1, 2, 8, 9, 16, 17, 64)}
    assert sizes == {0: [], 1: [], 2: [2], 8: [8], 9: [5, 4], 16: [8, 8], 17: [6, 6, 5], 64: [8] * 8}
    assert [list(r) for r in split_chains(5, most=2)] == [
        [0, 1],
        [2, 3],
        [4],
    ]  # a chain of one: only with at most 2 per chain
    for n in range(2, 40):
        cut = split_chains(n)
        assert [i for r in cut for i in r] == list(range(n)) and max(map(len, cut)) <= CHAIN_MAX


def test_the_dry_run_shows_each_chain() -> None:
    from nodekit import ship

    big = ship.Source(ref="nodekit/demo:abc", image_id="sha256:" + "a" * 64, size=2 << 30, engine_id="src")
    states = [ship.TargetState(target=ship.Target(f"n{i}", f"ssh://me@n{i}"), engine_id=f"e{i}", free_bytes=1 << 40)
              for i in range(10)]  # fmt: skip
    lines = ship.relay_text(ship.plan_push(big, states), "auto")
    assert [ln.split(" (")[0] for ln in lines] == ["  relayed: n0 -> n1 -> n2 -> n3 -> n4",
                                                   "  relayed: n5 -> n6 -> n7 -> n8 -> n9"]  # fmt: skip


def test_a_first_node_that_floods_its_stderr_cannot_make_the_head_hold_it_and_the_reports_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head reads the chain's stderr, which the first node (root there) can fill without end: 32 MiB here, many
    lines and then one long line without an end, between the nodes' report lines. The head holds a bounded amount
    however much comes (the peak of what Python allocated while it read), and still reads every report line."""
    from nodekit.ship import relay

    ok_a, ok_b = b64("Loaded image ID: sha256:aa"), b64("Loaded image ID: sha256:bb")
    first = (f"cat > /dev/null; echo 'nodekit-relay load {b64('a')} 0 {ok_a}' >&2; "
             f"yes 'junk from a compromised node' | head -c {24 << 20} >&2; "
             f"head -c {8 << 20} /dev/zero | tr '\\0' x >&2; echo >&2; "
             f"echo 'nodekit-relay load {b64('b')} 0 {ok_b}' >&2; echo 'nodekit-relay hop {b64('b')} 0' >&2; "
             "echo 'the last words' >&2")  # fmt: skip
    monkeypatch.setattr(hopkeys.ChainAccess, "open", lambda self: "the first node's relay step")
    monkeypatch.setattr(hopkeys.ChainAccess, "close", lambda self, kill=False: None)
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
