"""The head's side of a push's stream (:func:`nodekit.data.transport.frames`): small contents' frames travel together
in writes of about 64 KiB, not two writes per file, and the receiver reads that stream back byte for byte as the files
it was made from; a file that shrinks while it is sent stops the push."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from nodekit.data.transport import BATCH, DataError, block, frames
from nodekit.launcher.datacheck.filehash import CHUNK
from nodekit.launcher.datasync import receive


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def source(tmp_path: Path) -> dict[str, bytes]:
    """400 small files of 10 to 14 KiB and one of two MiB and a bit, written under tmp_path/src."""
    files = {f"d{i % 5}/{i:04d}.jpg": os.urandom(10_000 + 11 * i) for i in range(400)}
    files["big.bin"] = os.urandom(2 * CHUNK + 5)
    for name, data in files.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    return files


def test_small_frames_travel_together_and_each_frame_is_whole(source: dict[str, bytes], tmp_path: Path) -> None:
    incoming = {sha(d): len(d) for d in source.values()}
    holders = {sha(d): tmp_path / "src" / n for n, d in source.items()}
    pieces = list(frames(incoming, holders))
    expected = b"".join(f"{sha(d)} {len(d)}\n".encode() + d for d in source.values()) + b"END\n"
    assert b"".join(p for p, _ in pieces) == expected
    assert sum(n for _, n in pieces) == sum(incoming.values())
    assert all(len(p) <= max(CHUNK, BATCH + 15_000) for p, _ in pieces)
    small = sum(len(d) for n, d in source.items() if n != "big.bin")
    assert len(pieces) <= small // BATCH + 2 + 3  # the small ones' batches, the big one's line and its three pieces
    assert len(pieces) < len(source)  # not a write per file, let alone two


def test_the_receiver_reads_the_heads_stream_back_as_the_files(source: dict[str, bytes], tmp_path: Path) -> None:
    want = {n: [len(d), sha(d), "f"] for n, d in source.items()}
    plan = {"want": want, "place": {n: sha(d) for n, d in source.items()}, "adopt": [], "delete": [], "copy": {},
            "incoming": {sha(d): len(d) for d in source.values()}}  # fmt: skip
    holders = {sha(d): tmp_path / "src" / n for n, d in source.items()}
    data = block(json.dumps(plan).encode()) + b"".join(p for p, _ in frames(plan["incoming"], holders))
    out = io.StringIO()
    target = tmp_path / "target"
    target.mkdir()
    assert receive.main(["apply", str(target)], io.BytesIO(data), out) == 0
    assert json.loads(out.getvalue())["files"] == len(source)
    assert {n: (target / n).read_bytes() for n in source} == source


def test_a_small_file_that_shrank_while_it_was_sent_stops_the_push(source: dict[str, bytes], tmp_path: Path) -> None:
    name = "d3/0003.jpg"
    (tmp_path / "src" / name).write_bytes(source[name][:-1])
    incoming = {sha(d): len(d) for d in source.values()}
    holders = {sha(d): tmp_path / "src" / n for n, d in source.items()}
    with pytest.raises(DataError, match="shrank while it was sent"):
        list(frames(incoming, holders))
