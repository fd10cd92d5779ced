"""`nodekit data push` from the command line to a target on this machine (``--to unix://...``): the real receiver,
started by the real transport through this machine's python3. The same rules as over SSH (tests/cluster/
test_data.py): identical on arrival, nothing travels twice, damage repaired, the user's files never touched."""

from __future__ import annotations

import os
import re
from hashlib import sha256
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.launcher.datacheck.manifest import digest, manifest

runner = CliRunner()
HERE = "unix:///var/run/docker.sock"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text(
        'name = "datatest"\nscript = "train.py"\nnnodes = 1\n\n'
        f'[[mounts]]\nsource = "data"\nhost = "{tmp_path / "target"}"\ncontainer = "/data"\ncheck = "hashes"\n'
    )
    (tmp_path / "train.py").write_text("print('hi')\n")
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    for i in range(20):
        (data / "train" / f"{i:03d}.bin").write_bytes(os.urandom(1000 + i))
    (data / "big.parquet").write_bytes(os.urandom(3 << 20))
    (data / "copy-of-0.bin").write_bytes((data / "train" / "000.bin").read_bytes())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def push(*extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["data", "push", "--to", HERE, *extra])
    return result.exit_code, result.output


def sent(output: str) -> int:
    found = re.search(r"sent (\d+) bytes\)?$", output.strip().splitlines()[-1])
    assert found, output
    return int(found.group(1))


def same(project: Path) -> bool:
    return digest(manifest(str(project / "data"), hashes=True)) == digest(
        manifest(str(project / "target"), hashes=True)
    )


def test_a_dataset_arrives_identical_then_only_what_changed_travels(project: Path) -> None:
    data, target = project / "data", project / "target"
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    code, out = push()
    assert code == 0, out
    assert same(project)
    assert sent(out) == total - 1000  # the copy of train/000.bin travelled once
    code, out = push()
    assert code == 0 and sent(out) == 0, out
    (data / "train" / "007.bin").rename(data / "moved.bin")  # a rename: a copy on the node
    code, out = push()
    assert code == 0 and sent(out) == 0 and same(project), out
    assert not (target / "train" / "007.bin").exists()
    (data / "train" / "003.bin").write_bytes(os.urandom(4096))  # one file changes
    code, out = push()
    assert code == 0 and sent(out) == 4096 and same(project), out
    (data / "train" / "004.bin").unlink()  # deleted at the source: deleted on the node
    code, out = push()
    assert code == 0 and not (target / "train" / "004.bin").exists() and same(project), out


def test_a_damaged_copy_is_repaired_by_the_next_push(project: Path) -> None:
    target = project / "target"
    assert push()[0] == 0
    with open(target / "big.parquet", "r+b") as f:  # a flipped byte
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.truncate(target / "train" / "010.bin", 100)  # a truncated file
    (target / "train" / "011.bin").unlink()  # a lost one
    assert not same(project)
    code, out = push()
    assert code == 0, out
    assert same(project)
    assert 0 < sent(out) <= (3 << 20) + 1010 + 1011


def test_the_users_files_in_the_target_are_never_touched(project: Path) -> None:
    target = project / "target"
    target.mkdir()
    (target / "someone-elses.csv").write_text("theirs")
    code, out = push()
    assert code == 2, out
    assert "holds 1 file(s) nodekit did not put there" in out and "someone-elses.csv" in out
    assert sorted(os.listdir(target)) == ["someone-elses.csv"]  # nothing written, not even nodekit's state
    assert (target / "someone-elses.csv").read_text() == "theirs"
    # A file that is already the source's is kept, not sent again, and from then on nodekit's.
    (target / "someone-elses.csv").unlink()
    (target / "big.parquet").write_bytes((project / "data" / "big.parquet").read_bytes())
    code, out = push()
    assert code == 0 and same(project), out
    assert sent(out) < 1 << 20


def test_a_dry_run_says_what_would_travel_and_writes_nothing(project: Path) -> None:
    code, out = push("--dry-run")
    assert code == 0, out
    # 22 files, 21 contents: a content travels once, whatever its names.
    assert f"node 0 (this machine):{project / 'target'} <- {project / 'data'}: send 21 file(s)" in out
    assert "would send" in out
    assert not (project / "target").exists()


def test_a_source_that_holds_a_link_out_is_refused_in_one_line(project: Path, tmp_path: Path) -> None:
    (project / "data" / "escape").symlink_to("/etc/hostname")
    code, out = push()
    assert code == 2 and "escape is a link out of the source" in out, out
    assert not (project / "target").exists()


def test_the_dataset_is_never_part_of_the_image(project: Path) -> None:
    from nodekit.config import settings as config
    from nodekit.image.builder.tree import code_rules

    rules = code_rules(config.load(project / "nodekit.toml"))
    assert rules.excluded("data/big.parquet") and not rules.excluded("train.py")


def test_a_target_that_is_not_reached_over_ssh_is_refused_in_one_line(project: Path) -> None:
    result = runner.invoke(app, ["data", "push", "--to", "tcp://10.0.0.5:2375"])
    assert result.exit_code == 2, result.output
    assert "a dataset reaches a host over SSH, not tcp://" in result.output


def test_a_sourced_mount_cannot_be_writable(project: Path) -> None:
    toml = project / "nodekit.toml"
    toml.write_text(toml.read_text() + "writable = true\n")
    result = runner.invoke(app, ["data", "push", "--to", HERE])
    assert result.exit_code == 2, result.output
    assert "has a source and writable = true" in result.output
    assert not (project / "target").exists()


def _file_project(project: Path, host: Path) -> Path:
    """The project's dataset as one file (a tokenizer, one big shard), pushed to the file ``host``."""
    (project / "nodekit.toml").write_text(
        'name = "datatest"\nscript = "train.py"\nnnodes = 1\n\n'
        f'[[mounts]]\nsource = "data/big.parquet"\nhost = "{host}"\ncontainer = "/data/big.parquet"\n'
    )
    return project / "data" / "big.parquet"


def test_a_file_source_makes_the_host_path_exactly_that_file_and_only_a_change_travels(project: Path) -> None:
    shelf = project / "shelf"
    shelf.mkdir()
    (shelf / "theirs.csv").write_text("someone else's file beside it")
    host = shelf / "tokens.parquet"
    src = _file_project(project, host)
    code, out = push()
    assert code == 0, out
    assert host.is_file() and sha256(host.read_bytes()).digest() == sha256(src.read_bytes()).digest()
    assert sent(out) == src.stat().st_size
    assert (shelf / "theirs.csv").read_text() == "someone else's file beside it"  # its neighbours are not touched
    code, out = push()
    assert code == 0 and sent(out) == 0, out  # no change: no content travels
    src.write_bytes(os.urandom(5000))
    code, out = push()
    assert code == 0 and sent(out) == 5000, out
    assert sha256(host.read_bytes()).digest() == sha256(src.read_bytes()).digest()
    with open(host, "r+b") as f:  # a flipped byte on the host: repaired by the next push
        f.write(bytes([host.read_bytes()[0] ^ 0xFF]))
    code, out = push()
    assert code == 0 and sent(out) == 5000 and host.read_bytes() == src.read_bytes(), out


def test_a_file_source_never_overwrites_a_file_nodekit_did_not_put_there(project: Path) -> None:
    host = project / "tokens.parquet"
    host.write_text("the user's own file")
    _file_project(project, host)
    code, out = push()
    assert code == 2 and "tokens.parquet" in out and "nodekit did not put there" in out, out
    assert host.read_text() == "the user's own file"


def test_verify_rereads_every_file_from_disk_and_names_a_silent_change_the_cache_hides(project: Path) -> None:
    """A byte rewritten with its size and time set back is invisible to the hash caches (a plain push sends
    nothing and passes); ``--verify`` reads every file again, names the host and the file, exits 1 (a data error),
    and the next push repairs it."""
    target = project / "target"
    assert push()[0] == 0
    code, out = push("--verify")
    assert code == 0 and "verified" in out, out
    victim = target / "train" / "005.bin"
    st = victim.stat()
    with open(victim, "r+b") as f:  # bit rot: same size, same time, same inode
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0x01]))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out = push()
    assert code == 0 and sent(out) == 0, out  # the caches cannot see it
    code, out = push("--verify")
    assert code == 1, out
    assert "node 0 (this machine)" in out and "train/005.bin: content differs" in out, out
    code, out = push()
    assert code == 0 and sent(out) == 1005 and same(project), out


def test_a_host_without_python3_is_refused_in_one_line_before_anything_is_written(
    project: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver runs as the host's python3: a host that has none is refused before the first byte travels,
    with exit 2, naming the host, what is missing and the command that installs it; nothing is written there."""
    bare = tmp_path_factory.mktemp("bin-without-python3")
    monkeypatch.setenv("PATH", str(bare))
    code, out = push()
    assert code == 2, out
    line = next(ln for ln in out.splitlines() if "error" in ln)
    assert "node 0 (this machine) has no python3" in line and "apt-get install -y python3-minimal" in line, out
    assert "Traceback" not in out
    assert not (project / "target").exists()


@pytest.mark.parametrize(
    ("code", "said", "missing"),
    [
        (127, "bash: line 1: python3: command not found", "has no python3"),
        (127, "sh: 1: python3: not found", "has no python3"),
        (6, "nodekit-data: python3 is 3.8, the receiver needs 3.10 or later", "has python3 3.8, older than"),
    ],
)
def test_a_remote_host_without_a_usable_python3_is_a_one_line_usage_error(code: int, said: str, missing: str) -> None:
    """What the host's shell (127) or the receiver's boot (too old a python3) says, mapped to exit 2 naming the
    host and the fix run over its SSH."""
    from nodekit.data.transport import Where, failure
    from nodekit.errors import UsageError

    class Node:
        name, scheme, hostname, user, port = "node1", "ssh", "10.0.0.5", "alice", None

    err = failure(Where("node1", Node()), "/srv/data", code, said)
    assert isinstance(err, UsageError) and err.exit_code == 2
    assert err.message.startswith("node1") and missing in err.message, err.message
    assert "ssh alice@10.0.0.5 sudo apt-get install -y python3-minimal" in err.fix


def test_the_boot_stops_on_a_python3_older_than_the_receiver_needs_before_reading_anything() -> None:
    """The real boot, run by a python3 that reports 3.8: exit TOO_OLD with the line that `failure` turns into the
    one-line refusal."""
    import subprocess
    import sys

    from nodekit.data.transport import BOOT, TOO_OLD, Where, failure

    older = f"import sys\nsys.version_info = (3, 8, 1)\nexec(compile({BOOT!r}, 'boot', 'exec'))"
    done = subprocess.run([sys.executable, "-c", older, "scan", "/nonexistent"], input=b"", capture_output=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == TOO_OLD, done.stderr
    err = failure(Where("node 0 (this machine)"), "/nonexistent", done.returncode, done.stderr.decode())
    assert err.exit_code == 2 and err.message.startswith("node 0 (this machine) has python3 3.8"), err.message


@pytest.mark.parametrize("command", ["push", "gather"])
def test_push_and_gather_without_hosts_are_refused_alike_with_every_way_to_name_them(
    project: Path, command: str
) -> None:
    result = runner.invoke(app, ["data", command])
    assert result.exit_code == 2, result.output
    assert "no hosts: name them in nodekit.toml, or with --hostfile" in result.output, result.output
    assert ("--to ssh://user@host" in result.output) == (command == "push"), result.output
