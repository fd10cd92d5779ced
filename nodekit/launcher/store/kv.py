"""The preflight store: a small key-value store on main's preflight port that admits only the job.

It replaces ``torch.distributed.TCPStore`` there because a TCPStore accepts any write from anyone who reaches the
port. The protocol (``auth.py``) is a mutual challenge-response per connection, then MAC'd frames; main hosts it
(``server.py``), workers connect with ``client.Client``. Both offer the four calls preflight, the data check
and the peer watchdog use (``set``, ``get``, ``add``, ``check``, as TCPStore's: ``get`` waits for the key).

Caps (:class:`Limits`), enforced by main on every write and on every frame before its body is read:

- a value at most 64 MiB: a data-check manifest of 100,000 files with content hashes is about 14 MB (a line of
  path, size and 64-hex hash per file, ~140 bytes with 60-character paths), so paths up to ~500 characters fit;
- a key at most 4 KiB (keys hold a mount's container path); at most 65,536 keys (a job uses about 10 per node);
- 1 GiB stored in all (keys and values): every node's manifest of such a mount, for 64 nodes and more;
- at most 64 connections in the handshake at once (a new one pushes out the oldest), each with 5 s to finish it;
  a client that has not proven the secret can make main hold at most 36 bytes of its input;
- at most ``max(64, 2 * nnodes)`` admitted connections (one per worker is used);
- a frame on its way counts against the 1 GiB from its header on (its declared length is held back until its last
  byte), so a member cannot make main buffer unfinished frames beside the cap; one that does not fit is read and
  dropped without being kept (its MAC still checked) and answered "store is full"; a frame whose next byte does
  not come within ``frame_idle_s`` (30 s) ends its connection.

Standard library only: preflight does not wait for torch's import to host or join the store.
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ADMIT = b"ADMIT"  # main's first frame: the client's proof was good
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")


@dataclass(frozen=True)
class Limits:
    """What main's store holds and accepts at most (see the module docstring for why these sizes)."""

    max_value: int = 64 << 20
    max_key: int = 4096
    max_keys: int = 65_536
    max_total: int = 1 << 30
    max_pending: int = 64
    max_sessions: int = 64
    handshake_s: float = 5.0
    frame_idle_s: float = 30.0
    """An admitted connection in the middle of a frame is dropped when no byte of it came for this long: a LAN
    delivers the next byte of a 64 MiB value within milliseconds, and a stalled sender would otherwise hold its
    share of the total cap for ever."""

    @property
    def max_frame(self) -> int:
        """The largest frame payload either side accepts: a set of the largest key and value, with its header."""
        return 1 + U16.size + self.max_key + self.max_value


LIMITS = Limits()


class StoreError(RuntimeError):
    """A store call failed: main's store refused it (a cap), or the connection is gone. ``str()`` is one line."""


class NoHandshake(StoreError):
    """Main's port took connections, but none finished the handshake (an older nodekit there, or a flood)."""


class Table:
    """The data: keys and values, with the caps and the byte count enforced on every write. Thread-safe."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self._data: dict[bytes, bytes] = {}
        self.stored = 0  # bytes of keys and values
        self.ops = 0  # calls carried out, from the network and from main's own process (the watchdog's cost)
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return len(self._data)

    def _put(self, key: bytes, value: bytes) -> None:
        lim = self.limits
        if len(key) > lim.max_key or len(value) > lim.max_value:
            raise StoreError(f"store refused a key of {len(key)} or a value of {len(value)} bytes (caps: "
                             f"{lim.max_key}, {lim.max_value})")  # fmt: skip
        old = self._data.get(key)
        if old is None and len(self._data) >= lim.max_keys:
            raise StoreError(f"store is full: {lim.max_keys} keys")
        total = self.stored + len(key) + len(value) - (0 if old is None else len(key) + len(old))
        if total > lim.max_total:
            raise StoreError(f"store is full: {self.stored} of {lim.max_total} bytes")
        self._data[key] = value
        self.stored = total
        self._cond.notify_all()

    def set(self, key: bytes, value: bytes) -> None:
        with self._cond:
            self.ops += 1
            self._put(key, value)

    def get(self, key: bytes, wait_s: float = 0.0) -> bytes | None:
        with self._cond:
            self.ops += 1
            self._cond.wait_for(lambda: key in self._data, timeout=wait_s)
            return self._data.get(key)

    def add(self, key: bytes, amount: int) -> int:
        with self._cond:
            self.ops += 1
            old = self._data.get(key, b"0")
            try:
                value = int(old) + amount if len(old) <= 20 else None
            except ValueError:
                value = None
            if value is None or not -(2**63) <= value < 2**63:
                raise StoreError(f"store refused add on {key[:64]!r}: not a 64-bit counter")
            self._put(key, str(value).encode())
            return value

    def check(self, keys: list[bytes]) -> bool:
        with self._cond:
            self.ops += 1
            return all(k in self._data for k in keys)

    def apply(self, payload: bytes) -> bytes:
        """Carry out one request frame's payload (already authenticated); its response payload. ValueError when the
        payload is malformed (main then drops the connection)."""
        op, body = payload[:1], payload[1:]
        try:
            if op == b"S":
                (n,) = U16.unpack_from(body)
                if 2 + n > len(body):
                    raise ValueError("truncated key")
                self.set(body[2 : 2 + n], body[2 + n :])
                return b"O"
            if op == b"G":
                value = self.get(body)
                return b"N" if value is None else b"V" + value
            if op == b"A":
                (amount,) = I64.unpack_from(body)
                return b"I" + I64.pack(self.add(body[8:], amount))
            if op == b"C":
                return b"B" + (b"\x01" if self.check(unpack_keys(body)) else b"\x00")
        except StoreError as e:
            return b"E" + str(e).encode()
        except struct.error as e:
            raise ValueError(str(e)) from e
        raise ValueError(f"unknown store operation {op!r}")


def pack_keys(keys: list[bytes]) -> bytes:
    return b"".join(U16.pack(len(k)) + k for k in keys)


def unpack_keys(body: bytes) -> list[bytes]:
    keys, at = [], 0
    while at < len(body):
        (n,) = U16.unpack_from(body, at)
        if at + 2 + n > len(body):
            raise ValueError("truncated key list")
        keys.append(body[at + 2 : at + 2 + n])
        at += 2 + n
    return keys


def as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class Hosted:
    """Main's store: its calls go to the table in this process. The server's ``close`` runs when :meth:`close` is
    called or this object is garbage (``passed = None`` in the launcher ends the hosting, as it ended TCPStore's).
    ``port``, ``run_id`` and ``stats`` (the server's accounting) are the server's."""

    def __init__(
        self,
        table: Table,
        timeout_s: float,
        *,
        port: int,
        run_id: bytes,
        close: Callable[[], None],
        stats: Callable[[], Any],
    ) -> None:
        self.table, self.timeout_s, self.port, self.run_id, self.stats = table, timeout_s, port, run_id, stats
        self.wrong_secret: Callable[[], tuple[tuple[int, str], ...]] = tuple  # set by the server's host()
        self._finalizer = weakref.finalize(self, close)

    def set(self, key: str, value: str | bytes) -> None:
        self.table.set(key.encode(), as_bytes(value))

    def get(self, key: str) -> bytes:
        value = self.table.get(key.encode(), wait_s=self.timeout_s)
        if value is None:
            raise StoreError(f"no key {key!r} in the store within {self.timeout_s:g} s")
        return value

    def add(self, key: str, amount: int) -> int:
        return self.table.add(key.encode(), amount)

    def check(self, keys: list[str]) -> bool:
        return self.table.check([k.encode() for k in keys])

    def close(self) -> None:
        self._finalizer()
