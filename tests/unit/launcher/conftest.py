"""Builders for the launcher's unit tests: the captured dumps in fixtures/, and an in-memory preflight store.

fixtures/*-node<R>.json are what ``python -m nodekit.launcher.stacks`` printed on node R of real runs:
``training`` and ``mismatch`` from tests/integration/test_stall.py (``NODEKIT_STACKS_CAPTURE=<dir>``: two nodes of
examples/ddp/stall.py in the image, Python 3.11, gloo) while the job trained and once its ranks had issued different
collectives; ``py313-threads`` from a process with a second thread under Debian trixie's Python 3.13 (the hook armed
by hand, see the test that uses it).
"""

from __future__ import annotations

import threading
from pathlib import Path

from nodekit.launcher.stacks import collect
from nodekit.launcher.stacks.places import RankStack

FIXTURES = Path(__file__).parent / "fixtures"


def captured(name: str) -> list[RankStack]:
    """Every node's processes of one capture, as the host reads them."""
    stacks = []
    for path in sorted(FIXTURES.glob(f"{name}-node*.json")):
        node = int(path.stem.rsplit("-node", 1)[1])
        stacks += [RankStack.of(p, node) for p in collect.from_json(path.read_text())]
    assert stacks, f"no fixture {name}"
    return stacks


class DictStore:
    """The preflight store's four calls (``nodekit.launcher.preflight.exchange.Store``) over a dict, thread-safe."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        with self._lock:
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self._lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            return all(k in self.data for k in keys)
