"""The per-push hop keys (nodekit/ship/hopkeys.py): what the head accepts from a node, and the real setup, authorize
and end scripts run here by sh on a home directory of the test's own (no ssh, no node). sshd's side (from=,
expiry-time, the forced command) is tested against real sshd in tests/cluster/test_relay.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodekit.ship import hopkeys
from nodekit.ship.hopkeys import Dial, Hop, Prepared, authorized_line, parse_setup
from nodekit.ship.relay import RELAY_SCRIPT, parse_report, relay_script

KEY = "AAAAC3NzaC1lZDI1NTE5AAAAI" + "Q" * 43
DIR = "/tmp/nodekit-relay.Ab12Cd"

needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("ssh-keygen", "flock", "awk", "base64")), reason="no ssh-keygen/flock here"
)


def hop(name: str, host: str = "127.0.0.1") -> Hop:
    return Hop(name=name, endpoint=f"ssh://root@{host}", user="root", hostname=host, port=22, alias=host,
               known_hosts=f"{host} ssh-ed25519 AAAA\n")  # fmt: skip


def test_a_setup_answer_is_checked_as_untrusted_text() -> None:
    key2 = KEY[:-1] + "R"
    good = parse_setup(f"motd noise\nnodekit-relay-setup {DIR}\nnodekit-relay-dial 0 ssh-ed25519 {KEY} 10.0.0.7 "
                       f"fe80::1 10.0.0.7\nnodekit-relay-dial 1 ssh-ed25519 {key2} 10.0.0.8\n", feeds=2)  # fmt: skip
    assert good == Prepared(dir=DIR, dials=(Dial(KEY, ("10.0.0.7", "fe80::1")), Dial(key2, ("10.0.0.8",))))
    assert parse_setup(f"nodekit-relay-setup {DIR}\n", feeds=0) == Prepared(dir=DIR)
    setup = f"nodekit-relay-setup {DIR}\n"
    hostile = {
        f'nodekit-relay-setup /tmp/x"\nnodekit-relay-dial 0 ssh-ed25519 {KEY} 10.0.0.7': "its relay directory is not",
        f"nodekit-relay-setup /tmp/nodekit-relay.a;b\nnodekit-relay-dial 0 ssh-ed25519 {KEY} 1.2.3.4": "its relay dir",
        f"{setup}nodekit-relay-dial 0 ssh-rsa {KEY} 10.0.0.7": "it made no ed25519 key",
        f'{setup}nodekit-relay-dial 0 ssh-ed25519 {KEY}",command="sh 10.0.0.7': "it made no ed25519 key",
        f"{setup}nodekit-relay-dial 0 ssh-ed25519 {KEY} *": "it could not say which address",
        f"{setup}nodekit-relay-dial 0 ssh-ed25519 {KEY} 10.0.0.*,1.2.3.4": "it could not say which address",
        f"{setup}nodekit-relay-dial 0 ssh-ed25519 {KEY}": "it could not say which address",
        f"{setup}nodekit-relay-dial 1 ssh-ed25519 {KEY} 10.0.0.7": "it made a hop key nobody asked for",
        f"{setup}nodekit-relay-dial 0 ssh-ed25519 {KEY} 10.0.0.7\n" * 2: "it made a hop key nobody asked for",
        f"nodekit-relay-dial 0 ssh-ed25519 {KEY} 10.0.0.7\n": "it printed no setup line",
        setup: "it made no ed25519 key",  # no key for the node it feeds
        "": "it printed no setup line",
    }
    for answer, why in hostile.items():
        got = parse_setup(answer, feeds=1)
        assert isinstance(got, str) and got.startswith(why), (answer, got)


def test_the_line_restricts_the_key_to_the_next_nodes_relay_step_from_the_node_before() -> None:
    line = authorized_line(Dial(key=KEY, addrs=("10.0.0.7", "fd00::7")), Prepared(dir=DIR))
    command = hopkeys.entry_command(DIR)
    assert line == f'restrict,from="10.0.0.7,fd00::7",command="{command}" ssh-ed25519 {KEY} nodekit-relay'
    assert '"' not in command
    for before in (Dial(key=KEY + "\nssh-ed25519", addrs=("10.0.0.7",)), Dial(key=KEY, addrs=("*",)),
                   Dial(key=KEY, addrs=())):  # fmt: skip
        with pytest.raises(ValueError):
            authorized_line(before, Prepared(dir=DIR))
    with pytest.raises(ValueError):
        authorized_line(Dial(key=KEY, addrs=("10.0.0.7",)), Prepared(dir='/tmp/nodekit-relay.x" y'))


@dataclass(frozen=True)
class Feeder(Dial):
    """How a node set up to feed one other dials it, and that node's own relay directory."""

    dir: str = ""


class Node:
    """A node's side of the scripts: sh with HOME set to a directory of the test's own."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.keys = home / ".ssh" / "authorized_keys"

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        env = {"HOME": str(self.home), "PATH": os.environ["PATH"], "SSH_CONNECTION": "10.9.0.1 40000 10.9.0.2 22"}
        return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30)

    def setup(self, *feeds: Hop) -> Prepared:
        done = self.run(hopkeys.setup_command(hop("me"), feeds, RELAY_SCRIPT))
        got = parse_setup(done.stdout, feeds=len(feeds))
        assert isinstance(got, Prepared), (done.stdout, done.stderr)
        return got

    def feeder(self, after: Hop) -> Feeder:
        """Set up as a node that feeds ``after`` only: how it dials it, and its directory."""
        got = self.setup(after)
        return Feeder(key=got.dials[0].key, addrs=got.dials[0].addrs, dir=got.dir)

    def authorize(self, before: Dial, here: Prepared, lifetime: int = hopkeys.KEY_LIFETIME_S) -> None:
        done = self.run(hopkeys.authorize_command(authorized_line(before, here), lifetime, here.dir, before.key))
        assert done.returncode == 0, done.stderr

    def end(self, relay_dir: str, key: str, *, kill: bool = False) -> None:
        done = self.run(hopkeys.end_command(relay_dir, key, kill=kill))
        assert done.returncode == 0, done.stderr


USER_LINES = 'ssh-ed25519 AAAAuser me@laptop\nfrom="10.*" ssh-rsa AAAAold old key nodekit-relay\n'


@needs_tools
def test_setup_makes_a_private_directory_and_a_key_that_never_leaves_the_node(tmp_path: Path) -> None:
    node = Node(tmp_path)
    got = node.setup(hop("next", "127.0.0.1"), hop("other", "127.0.0.2"))
    d = Path(got.dir)
    try:
        assert (d.stat().st_mode & 0o777) == 0o700 and (d / "relay").read_text() == RELAY_SCRIPT
        # One key per node it feeds: a hop key is spent by one relay step, even where both share authorized_keys.
        assert len({dial.key for dial in got.dials}) == 2
        for j, (dial, dest) in enumerate(zip(got.dials, ("root@127.0.0.1", "root@127.0.0.2"), strict=True)):
            c = d / f"c{j}"
            assert (c.stat().st_mode & 0o777) == 0o700 and ((c / "key").stat().st_mode & 0o777) == 0o600
            assert (c / "key.pub").read_text().split()[1] == dial.key
            assert (c / "dest").read_text() == dest and (c / "port").read_text() == "22"
            assert "10.9.0.2" in dial.addrs  # where the head reached it (SSH_CONNECTION)
    finally:
        node.end(got.dir, "")
    assert not d.exists()


@needs_tools
def test_concurrent_pushes_keep_each_others_lines_and_the_users_lines_stay_as_they_were(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.keys.parent.mkdir(mode=0o700)
    node.keys.write_text(USER_LINES)
    before = [Node(tmp_path).feeder(hop("n")) for _ in range(2)]
    heres = [node.setup() for _ in range(2)]
    lines = [authorized_line(b, h) for b, h in zip(before, heres, strict=True)]
    # Two pushes authorise at the same moment (flock keeps the read-and-replace of one from losing the other's line).
    commands = [hopkeys.authorize_command(line, 300, h.dir, b.key) for line, b, h in zip(lines, before, heres,
                                                                                         strict=True)]  # fmt: skip
    procs = [subprocess.Popen(["sh", "-c", c], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]})
             for c in commands]  # fmt: skip
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    text = node.keys.read_text()
    assert text.startswith(USER_LINES) and len(text.splitlines()) == 4
    for line in lines:
        written = next(ln for ln in text.splitlines() if ln.endswith(line))
        got = re.fullmatch(r'expiry-time="(\d{14})",', written[: -len(line)])
        assert got is not None, written
        expires = time.mktime(time.strptime(got.group(1), "%Y%m%d%H%M%S"))  # the node's clock and zone: this one's
        assert abs(expires - (time.time() + 300)) < 60, written
    assert (node.keys.stat().st_mode & 0o777) == 0o600
    node.end(heres[0].dir, before[0].key)
    assert node.keys.read_text() == USER_LINES + next(ln for ln in text.splitlines()[2:] if lines[1] in ln) + "\n"
    node.end(heres[1].dir, before[1].key)
    assert node.keys.read_text() == USER_LINES
    for b in before:
        node.end(b.dir, "")


@needs_tools
def test_expired_lines_of_earlier_pushes_go_with_the_next_push(tmp_path: Path) -> None:
    """A push whose head died leaves its line; sshd refuses it after its expiry, and the next push removes it."""
    node = Node(tmp_path)
    node.keys.parent.mkdir(mode=0o700)
    node.keys.write_text(USER_LINES)
    old = authorized_line(Dial(key=KEY, addrs=("10.0.0.7",)), Prepared(dir=DIR))
    with node.keys.open("a") as f:
        f.write(f'expiry-time="20200101000000",{old}\n')
    before, here = Node(tmp_path).feeder(hop("n")), node.setup()
    node.authorize(before, here)
    assert "20200101000000" not in node.keys.read_text() and node.keys.read_text().startswith(USER_LINES)
    node.end(here.dir, before.key)
    node.end(before.dir, "")
    assert node.keys.read_text() == USER_LINES


@needs_tools
def test_authorized_keys_is_written_through_a_link_and_a_read_only_one_is_left_alone(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.keys.parent.mkdir(mode=0o700)
    real = tmp_path / "managed_keys"
    real.write_text(USER_LINES)
    node.keys.symlink_to(real)
    before, here = Node(tmp_path).feeder(hop("n")), node.setup()
    node.authorize(before, here)
    assert node.keys.is_symlink() and real.read_text().startswith(USER_LINES) and KEY[:10] in real.read_text()
    node.end(here.dir, before.key)
    assert real.read_text() == USER_LINES
    real.chmod(0o444)  # read-only by its owner's choice (root could write it: the script checks the mode)
    again = node.setup()
    done = node.run(hopkeys.authorize_command(authorized_line(before, again), 300, again.dir, before.key))
    assert done.returncode != 0 and real.read_text() == USER_LINES
    node.end(before.dir, "")
    node.end(again.dir, "")


@needs_tools
def test_ending_kills_only_the_relay_step_this_node_recorded(tmp_path: Path) -> None:
    """The head ends, on a node, the process group recorded in that node's own relay directory, and only while
    that group still runs the relay step there: a stale or forged number names nobody it will kill."""
    node = Node(tmp_path)
    step, other = node.setup(), node.setup()
    # A stand-in for the relay step: in its directory, its command line `sh ./relay DIR`, as entry_command runs it.
    relay = subprocess.Popen(["sh", "-c", "sleep 60", "./relay", step.dir], cwd=step.dir, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (Path(other.dir) / "pgid").write_text(f"{bystander.pid}\n")  # a number that is not this node's relay step
        node.end(other.dir, "", kill=True)
        (Path(step.dir) / "pgid").write_text(f"{relay.pid}\n")
        node.end(step.dir, "", kill=True)
        assert relay.wait(timeout=10) == -signal.SIGTERM
        assert bystander.poll() is None, "a process group that was not the relay step was killed"
        assert not Path(step.dir).exists() and not Path(other.dir).exists()
    finally:
        for p in (relay, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


def _as_nobody() -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root (a second user) and setpriv"
)


@needs_tools
@needs_root
def test_the_entry_command_runs_only_a_relay_in_the_users_own_private_directory(tmp_path: Path) -> None:
    """Issue 28: the line's command was `exec sh DIR/relay`, and DIR, once its step had removed it, could be made
    again in /tmp by any local user with a relay of their own, which the next login with the hop key ran as root.
    Now the command enters DIR and runs ./relay only when what it entered is the login user's, mode 0700."""
    node = Node(tmp_path)
    mine = node.setup()
    (Path(mine.dir) / "relay").write_text('echo "ran $(id -u) $1"\n')
    ran = node.run(hopkeys.entry_command(mine.dir))
    assert ran.stdout == f"ran 0 {mine.dir}\n", ran.stderr
    node.end(mine.dir, "")
    # Another user makes the same path again, with their own relay (and a mode that would pass).
    planted = subprocess.run([*_as_nobody(), "sh", "-c", f'mkdir -m 700 {mine.dir} && echo "echo ran \\$(id -u)" > '
                              f"{mine.dir}/relay"], capture_output=True, text=True)  # fmt: skip
    assert planted.returncode == 0, planted.stderr
    try:
        ran = node.run(hopkeys.entry_command(mine.dir))
        assert ran.returncode == 126 and "ran" not in ran.stdout, ran.stdout
        assert "is not a mode 0700 directory of this user" in ran.stderr
        os.chown(mine.dir, 0, 0)
        os.chmod(mine.dir, 0o770)  # the user's own, but others in its group could write into it
        ran = node.run(hopkeys.entry_command(mine.dir))
        assert ran.returncode == 126 and "ran" not in ran.stdout, ran.stdout
    finally:
        shutil.rmtree(mine.dir, ignore_errors=True)


@needs_tools
@needs_root
def test_a_link_another_user_puts_where_a_relay_directory_was_runs_nothing(tmp_path: Path) -> None:
    """A line left naming a directory that is gone (a head whose rewrite of authorized_keys failed): another user
    puts a link there to a live relay directory of another push (the user's own, mode 0700). The hop key must run
    nothing through it: not the other push's relay step, whose one run it would spend."""
    node = Node(tmp_path)
    gone, other = node.setup(), node.setup()
    node.end(gone.dir, "")
    (Path(other.dir) / "relay").write_text('echo "ran $1 in $(pwd)"\n')
    made = subprocess.run([*_as_nobody(), "ln", "-s", other.dir, gone.dir], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        ran = node.run(hopkeys.entry_command(gone.dir))
        assert ran.returncode == 126 and "ran" not in ran.stdout, ran.stdout
        assert "is not a mode 0700 directory of this user, or is a link" in ran.stderr
    finally:
        Path(gone.dir).unlink(missing_ok=True)
        node.end(other.dir, "")


@needs_tools
def test_a_relay_step_removes_its_line_before_its_directory(tmp_path: Path) -> None:
    """The relay step on the last node, run as sshd runs the line's command (a `docker` here that takes the stream
    and says nothing): when it exits, the line for the node before's key is gone, then its directory."""
    node = Node(tmp_path)
    node.keys.parent.mkdir(mode=0o700)
    node.keys.write_text(USER_LINES)
    before, here = Node(tmp_path).feeder(hop("n")), node.setup()
    node.authorize(before, here)
    assert KEY[:0] + before.key in node.keys.read_text()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text("#!/bin/sh\ncat > /dev/null\n")
    (fake / "docker").chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{fake}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", hopkeys.entry_command(here.dir)], input=b"stream", env=env,
                          capture_output=True, timeout=30)  # fmt: skip
    assert done.returncode == 0 and b"nodekit-relay load" in done.stderr, done.stderr
    assert node.keys.read_text() == USER_LINES and not Path(here.dir).exists()
    node.end(before.dir, "")


def _fake_docker(home: Path) -> dict[str, str]:
    """The environment a relay step runs in here: a ``docker`` that notes each load it starts and takes the stream."""
    fake = home / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "docker").write_text(f"#!/bin/sh\necho $$ >> {home}/loads\ncat > /dev/null\n")
    (fake / "docker").chmod(0o755)
    return {"HOME": str(home), "PATH": f"{fake}:{os.environ['PATH']}"}


def _login(relay_dir: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A login with the hop key, as sshd runs its line's command: the stream stays open until the test closes it."""
    return subprocess.Popen(["sh", "-c", hopkeys.entry_command(relay_dir)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _until(what: str, done: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _loads(home: Path) -> int:
    path = home / "loads"
    return len(path.read_text().split()) if path.exists() else 0


@needs_tools
def test_a_relay_step_spends_its_hop_key_as_it_starts_and_a_second_login_runs_nothing(tmp_path: Path) -> None:
    """A hop-key line admits one relay step: the step removes the line as it starts (sshd then refuses the key), and
    a second login that got in before that (the same key used twice at once) is refused by the step itself."""
    node = Node(tmp_path)
    node.keys.parent.mkdir(mode=0o700)
    node.keys.write_text(USER_LINES)
    before, here = Node(tmp_path).feeder(hop("n")), node.setup()
    node.authorize(before, here)
    env = _fake_docker(tmp_path)
    first = _login(here.dir, env)
    second: subprocess.Popen[bytes] | None = None
    try:
        _until("the first relay step never started its load", lambda: _loads(tmp_path) == 1)
        assert node.keys.read_text() == USER_LINES, "the running relay step left its hop key usable"
        second = _login(here.dir, env)
        _, said = second.communicate(timeout=30)
        assert second.returncode == 126 and b"hop key was used already" in said, said
        assert _loads(tmp_path) == 1 and first.poll() is None and Path(here.dir).is_dir()
        _, said = first.communicate(b"stream", timeout=30)
        assert first.returncode == 0 and b"nodekit-relay load" in said, said
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert node.keys.read_text() == USER_LINES and not Path(here.dir).exists()
    node.end(before.dir, "")


@needs_tools
@needs_root
def test_a_second_login_cannot_write_or_read_through_links_planted_after_the_first_ones_cleanup(
    tmp_path: Path,
) -> None:
    """The review's race (N1): two logins A and B with the same hop key, both streams open. A ends and its cleanup
    removes the line and the directory; another user makes the directory again with ``rc`` and ``out`` links into a
    root-only directory; then B ends. B, root, must write nothing through ``rc`` and send nothing of what ``out``
    points at to the key's holder (before, it wrote its exit code into the link's target and the last lines of a
    root-only file went back on stderr)."""
    node = Node(tmp_path)
    node.keys.parent.mkdir(mode=0o700)
    node.keys.write_text(USER_LINES)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o711)
    shadow = victim / "shadow"
    secret = "root:$6$FAKEHASH:19000:0:99999:7:::\nalice:$6$ALICEHASH:19000:0:99999:7:::\n"
    shadow.write_text(secret)
    shadow.chmod(0o640)
    before, here = Node(tmp_path).feeder(hop("n")), node.setup()
    node.authorize(before, here)
    env = _fake_docker(tmp_path)
    a = _login(here.dir, env)
    b: subprocess.Popen[bytes] | None = None
    try:
        _until("A's relay step never started its load", lambda: _loads(tmp_path) == 1)
        b = _login(here.dir, env)
        _until(
            "B neither ran nor was refused", lambda: b is not None and (b.poll() is not None or _loads(tmp_path) == 2)
        )
        a.communicate(b"", timeout=30)
        assert not Path(here.dir).exists()
        plant = (f"mkdir -m 700 {here.dir} && ln -s {victim}/target {here.dir}/rc && "
                 f"ln -s {shadow} {here.dir}/out")  # fmt: skip
        planted = subprocess.run([*_as_nobody(), "sh", "-c", plant], capture_output=True, text=True)
        assert planted.returncode == 0, planted.stderr
        _, said = b.communicate(b"", timeout=30)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(here.dir, ignore_errors=True)
    assert not (victim / "target").exists(), "the second login wrote through a link another user planted"
    assert shadow.read_text() == secret
    report = parse_report(said.decode(errors="replace"))
    shown = said.decode(errors="replace") + repr(report.loads)
    assert "FAKEHASH" not in shown and "ALICEHASH" not in shown, shown
    assert b.returncode == 126, said
    node.end(before.dir, "")


@needs_tools
def test_a_dataset_relay_step_feeds_its_nodes_receiver_only_what_the_head_wrote_there(tmp_path: Path) -> None:
    """The data tree's relay step on a node (no child: a leaf): its receiver's code, plan and path are what the
    head wrote into the node's directory over its own connection (put_command); the stream brings only contents,
    of which the node writes the ones its plan names and reads past the rest. Nothing of the step is left."""
    import hashlib
    import json

    from nodekit.data import transport, tree

    node = Node(tmp_path)
    done = node.run(hopkeys.setup_command(hop("me"), [], relay_script("none", consumer=tree.CONSUMER)))
    here = parse_setup(done.stdout, feeds=0)
    assert isinstance(here, Prepared), done.stderr
    target = tmp_path / "target"
    target.mkdir()
    good, other = b"good" * 1000, b"for another node"
    sha = {d: hashlib.sha256(d).hexdigest() for d in (good, other)}
    plan = {"want": {"a/b.bin": [len(good), sha[good], "f"]}, "place": {"a/b.bin": sha[good]},
            "incoming": {sha[good]: len(good)}, "copy": {}, "delete": [], "adopt": [],
            "passing": {sha[other]: len(other)}}  # fmt: skip
    given = transport.bundle() + transport.block(json.dumps(plan).encode())
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    put = subprocess.run(["sh", "-c", hopkeys.put_command(here.dir, str(target))], input=given, env=env,
                         capture_output=True, timeout=30)  # fmt: skip
    assert put.returncode == 0, put.stderr
    stream = b"".join(f"{sha[d]} {len(d)}\n".encode() + d for d in (other, good)) + b"END\n"
    ran = subprocess.run(["sh", "-c", hopkeys.entry_command(here.dir)], input=stream, env=env,
                         capture_output=True, timeout=60)  # fmt: skip
    report = parse_report(ran.stderr.decode())
    assert report.loads.get("me", (None, ""))[0] == 0, ran.stderr
    assert (target / "a" / "b.bin").read_bytes() == good
    assert sorted(p.name for p in target.rglob("*") if p.is_file() and ".nodekit-data" not in p.parts) == ["b.bin"]
    assert not Path(here.dir).exists()


@needs_tools
def test_the_head_writes_a_nodes_input_only_into_a_private_relay_directory_of_its_own(tmp_path: Path) -> None:
    node = Node(tmp_path)
    here = node.setup()
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}

    def put(where: str) -> int:
        return subprocess.run(["sh", "-c", hopkeys.put_command(where, "/srv/data")], input=b"plan", env=env,
                              capture_output=True, timeout=30).returncode  # fmt: skip

    assert put(here.dir) == 0
    assert (Path(here.dir) / "arg").read_text() == "/srv/data" and (Path(here.dir) / "given").read_bytes() == b"plan"
    assert put(here.dir) != 0  # written once: set -C, never through what is there
    other = node.setup()
    os.chmod(other.dir, 0o755)  # no longer private: what is in it may not be the head's
    assert put(other.dir) != 0 and not (Path(other.dir) / "given").exists()
    link = Path(f"/tmp/nodekit-relay.{os.getpid()}lnk")
    link.symlink_to(here.dir)
    try:
        assert put(str(link)) != 0
    finally:
        link.unlink()
    node.end(here.dir, "")
    os.chmod(other.dir, 0o700)  # private again, so that the end step removes it (it leaves one that is not)
    node.end(other.dir, "")
    assert not Path(here.dir).exists() and not Path(other.dir).exists()
