"""What takes a relay tree's stream on each node (nodekit/data/tree.py's CONSUMER), run for real by sh in a node's
relay directory as the relay step runs it: its code and plan from ``./given``, the stream from the ``./load`` fifo
that the step's tee writes, the target from ``./arg``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

from nodekit.data import transport, tree
from nodekit.launcher.datacheck.manifest import PIECE, content_hashes


def _readers_of(fifo: Path, deadline_s: float = 10.0) -> list[str]:
    """The programs (other than this one) holding ``fifo`` open, once one is a python (the shell, and a python
    launcher shim where there is one, open a redirection before they exec the command); what holds it at the
    deadline otherwise."""
    end, found = time.monotonic() + deadline_s, []
    while time.monotonic() < end:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid():
                continue
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(fifo) for fd in fds):
                    found.append(Path(os.readlink(f"/proc/{pid}/exe")).name)
            except OSError:
                continue
        if any(name.startswith("python") for name in found):
            return found
        time.sleep(0.05)
    return found


def test_the_node_reads_the_stream_straight_from_the_fifo_into_its_target(tmp_path: Path) -> None:
    """The receiver itself reads the fifo: no process between the relay step's tee and the receiver copies every
    byte once more (on a tree's every node, for every byte of the dataset)."""
    relay_dir, target = tmp_path / "relay", tmp_path / "target"
    relay_dir.mkdir()
    files = {"small/a.jpg": os.urandom(50_000), "big.parquet": os.urandom(PIECE + 12_345)}
    src = tmp_path / "src"
    src.mkdir()
    hashes = {}
    for name, data in files.items():
        (src / name.replace("/", "_")).write_bytes(data)
        hashes[name] = content_hashes([(str(src / name.replace("/", "_")), len(data))])[0]
    passing = os.urandom(3000)
    plan = {
        "want": {n: [len(d), hashes[n], "f"] for n, d in files.items()},
        "place": dict(hashes),
        "incoming": {hashes[n]: len(d) for n, d in files.items()},
        "passing": {hashlib.sha256(passing).hexdigest(): len(passing)},
        "copy": {},
        "delete": [],
        "adopt": [],
    }
    (relay_dir / "given").write_bytes(transport.bundle() + transport.block(json.dumps(plan).encode()))
    (relay_dir / "arg").write_text(str(target))
    fifo = relay_dir / "load"
    os.mkfifo(fifo)
    node = subprocess.Popen(["sh", "-c", tree.CONSUMER], cwd=relay_dir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        with open(fifo, "wb") as load:
            readers = _readers_of(fifo)
            load.write(f"{hashlib.sha256(passing).hexdigest()} {len(passing)}\n".encode() + passing)
            for name, data in files.items():
                load.write(f"{hashes[name]} {len(data)}\n".encode() + data)
            load.write(b"END\n")
        out, err = node.communicate(timeout=60)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    assert node.returncode == 0, err.decode()
    assert json.loads(out.decode().splitlines()[-1])["ok"]
    assert {n: (target / n).read_bytes() for n in files} == files
    assert len(readers) == 1 and readers[0].startswith("python"), readers


def test_a_stream_that_ends_early_on_the_fifo_is_a_broken_stream(tmp_path: Path) -> None:
    relay_dir, target = tmp_path / "relay", tmp_path / "target"
    relay_dir.mkdir()
    data = os.urandom(2 << 20)
    h = hashlib.sha256(data).hexdigest()
    plan = {"want": {"a.bin": [len(data), h, "f"]}, "place": {"a.bin": h}, "incoming": {h: len(data)}}
    (relay_dir / "given").write_bytes(transport.bundle() + transport.block(json.dumps(plan).encode()))
    (relay_dir / "arg").write_text(str(target))
    os.mkfifo(relay_dir / "load")
    node = subprocess.Popen(["sh", "-c", tree.CONSUMER], cwd=relay_dir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip

    def feed() -> None:
        with open(relay_dir / "load", "wb") as load:
            load.write(f"{h} {len(data)}\n".encode() + data[: len(data) // 2])  # the node above it died here

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        _, err = node.communicate(timeout=60)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    writer.join(10)
    assert node.returncode == transport.BROKEN, err.decode()
    assert not (target / "a.bin").exists()
