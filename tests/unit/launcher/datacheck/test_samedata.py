"""The same-data check's protocol between nodes, over an in-memory store, on real directories."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from nodekit.launcher.config import parse_env
from nodekit.launcher.datacheck import compare as samedata
from tests.factories import LAUNCH_ENV


class MemoryStore:
    """The four calls of torch's TCPStore the protocol uses; get() waits for the key as TCPStore's does."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: str) -> None:
        with self.cond:
            self.data[key] = value.encode()
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=10), key
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)


def _dataset(root: Path, label: str = "cat") -> Path:
    (root / "train").mkdir(parents=True)
    for i in range(5):
        (root / "train" / f"{i:03d}.txt").write_text(f"{label} {i}")
    return root


def _run_two(paths: dict[int, Path], mode: str) -> dict[int, tuple[bool, str]]:
    store = MemoryStore()
    results: dict[int, tuple[bool, str]] = {}

    def node(rank: int) -> None:
        def scan(target: str, hashes: bool) -> tuple[samedata.Entry, ...]:
            return samedata.manifest(str(paths[rank]), hashes=hashes)  # each node's own host path at /data

        results[rank] = samedata.run(store, rank, 2, [("/data", mode)], timeout_s=10, scan=scan)

    threads = [threading.Thread(target=node, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(20)
    return results


def test_the_same_dataset_passes(tmp_path: Path) -> None:
    results = _run_two({0: _dataset(tmp_path / "a"), 1: _dataset(tmp_path / "b")}, "sizes")
    assert results[0] == results[1]
    ok, report = results[0]
    assert ok and "/data: same paths and sizes on 2 nodes (5 files" in report


def test_a_dataset_differing_on_one_node_is_refused_with_the_file_named(tmp_path: Path) -> None:
    other = _dataset(tmp_path / "b")
    (other / "train" / "003.txt").write_text("a longer cat 3")
    results = _run_two({0: _dataset(tmp_path / "a"), 1: other}, "sizes")
    assert results[0] == results[1]  # every node prints the same report
    ok, report = results[0]
    assert not ok
    assert "DATA DIFFERS" in report and "exit 17" in report
    assert "train/003.txt: 14 bytes, main has 5" in report


def test_content_hashes_catch_an_equal_size_change(tmp_path: Path) -> None:
    results = _run_two({0: _dataset(tmp_path / "a"), 1: _dataset(tmp_path / "b", "dog")}, "hashes")
    ok, report = results[1]
    assert not ok and "train/000.txt: content differs" in report


def test_the_checked_mounts_parse() -> None:
    cfg = parse_env({**LAUNCH_ENV, "NODEKIT_DATA_CHECK": "/data:sizes,/ref:hashes"})
    assert cfg.data_check == (("/data", "sizes"), ("/ref", "hashes"))
