"""The head's side of a node's output directory (:mod:`nodekit.launcher.datasync.outputs` runs on the node, booted
by :mod:`nodekit.data.transport`): list it, fetch files from it into a content store here, put files from that store
onto it. Every call has a deadline; every name a node answers is checked here before it is used (a node is not
trusted to name only files under its directory), and every byte fetched is hashed as it lands and kept only when
it is the content the node's listing announced.

The content store is a directory of files named by content hash (``objects/<hash>``): a content fetched once is
never fetched again, from that node or another, and a fetch cut short keeps every content that arrived whole.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nodekit.data.transport import HASH_RATE, SCAN_BASE_S, STALL_S, DataError, Where, block, bundle, failure, talk
from nodekit.launcher.datasync.names import hash_problem, name_problem
from nodekit.launcher.datasync.receive import _copy_hashing
from nodekit.launcher.datasync.scan import Cache, Manifest
from nodekit.system import proc

SKIPPED = -1


@dataclass(frozen=True)
class Listing:
    """A node's output directory: ``files`` (name -> (size, hash)), the cache the next listing sends, and the
    entries the node could not offer (links, special files, odd names)."""

    files: Manifest
    cache: Cache
    skipped: tuple[str, ...] = ()


def checked_listing(answer: Mapping[str, Any], *, where: str) -> Listing:
    """The node's answer, every name and hash checked; DataError naming the first bad one (nothing is written for a
    node whose listing holds one: a node that names ``../x`` is not trusted with the rest)."""
    files: Manifest = {}
    cache: Cache = {}
    raw = answer.get("files")
    if not isinstance(raw, dict):
        raise DataError(f"{where}: the node's listing is not well formed", fix="check the node's python3")
    for name, v in raw.items():
        problem = name_problem(name)
        if problem is None and not (isinstance(v, list) and len(v) == 4 and isinstance(v[0], int) and v[0] >= 0):
            problem = f"{name!r}: a bad entry"
        if problem is None:
            problem = hash_problem(v[3])
        if problem is not None:
            raise DataError(f"{where} offered a file nodekit refuses: {problem}",
                            fix="nothing was written for that node; see what its output directory holds")  # fmt: skip
        files[name] = (v[0], v[3])
        cache[name] = list(v)
    skipped = tuple(str(s) for s in answer.get("skipped", []))
    return Listing(dict(sorted(files.items())), cache, skipped)


def listing(where: Where, root: str, cache: Mapping[str, list[object]], exclude: Sequence[str] = ()) -> Listing:
    """The node's output directory ``root`` (missing: empty)."""
    payload = json.dumps({"cache": dict(cache), "exclude": list(exclude)}).encode()
    sizes = sum(int(v[0]) for v in cache.values() if isinstance(v, list) and v and isinstance(v[0], int))
    done = proc.run(where.argv("list", root), deadline=SCAN_BASE_S + sizes / HASH_RATE,
                    what=f"the listing of {where.name}:{root}", fix="check the host's disk and that ssh to it works",
                    given=bundle() + block(payload))  # fmt: skip
    if done.returncode != 0:
        raise failure(where, root, done.returncode, done.stderr)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DataError(f"{where.name}: the listing of {root} is not JSON", fix="check the node's python3") from None
    if not isinstance(answer, dict):
        raise DataError(f"{where.name}: the listing of {root} is not an object", fix="check the node's python3")
    return checked_listing(answer, where=f"{where.name}:{root}")


def object_path(store: Path, h: str) -> Path:
    return store / h.replace(":", "_")


def _read_exactly(child: proc.Child, f: IO[bytes], n: int) -> bytes:
    with child.waiting():
        data = f.read(n)
    return data


class _Frames:
    """A reader that counts the bytes it hands on (for :func:`_copy_hashing`) under the child's stall deadline."""

    def __init__(self, child: proc.Child, f: IO[bytes], on_bytes: Callable[[int], None]) -> None:
        self.child, self.f, self.on_bytes = child, f, on_bytes

    def read(self, n: int) -> bytes:
        data = _read_exactly(self.child, self.f, n)
        self.on_bytes(len(data))
        return data

    def readline(self, n: int) -> bytes:
        with self.child.waiting():
            return self.f.readline(n)


def fetch(
    where: Where,
    root: str,
    wanted: Mapping[str, tuple[int, str]],
    store: Path,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> tuple[set[str], list[str]]:
    """Bring each wanted file (name -> (size, hash)) into ``store`` as its content: the hashes now held, and the names
    that could not be (gone or changed on the node since its listing, or damaged on the way)."""
    store.mkdir(exist_ok=True)  # not its parents: a store removed (its run ended) is not made again
    order = [(n, s, h) for n, (s, h) in wanted.items() if not object_path(store, h).exists()]
    if not order:
        return {h for _, h in wanted.values()}, []
    child = proc.start(where.argv("send", root), deadline=proc.Stall(STALL_S),
                       what=f"the fetch from {where.name}:{root}", fix="check the link to that host; run it again",
                       stdin="pipe", stdout="pipe", stderr="pipe", group=True)  # fmt: skip
    assert child.stdout is not None
    missed: list[str] = []
    frames = _Frames(child, child.stdout, on_bytes)

    def exchange() -> None:
        assert child.stdin is not None
        with child.waiting():
            child.stdin.write(bundle() + block(json.dumps({"files": [list(o) for o in order]}).encode()))
            child.stdin.close()
        for name, size, h in order:
            line = frames.readline(32).strip()
            if line == str(SKIPPED).encode():
                missed.append(name)
                continue
            if not line.isdigit() or int(line) != size:
                child.check()
                raise DataError(f"{where.name}:{root} sent a frame it was not asked for ({line[:40]!r})",
                                fix="run it again; if it repeats, check the host's python3")  # fmt: skip
            tmp = store / f".{h.replace(':', '_')}.{os.getpid()}.{threading.get_ident()}.part"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                got = _copy_hashing(frames, out, size)  # type: ignore[arg-type]
            if got != h:
                tmp.unlink()
                missed.append(name)
                continue
            os.replace(tmp, object_path(store, h))

    try:
        code, _, err = talk(child, exchange, SCAN_BASE_S, late=f"{where.name}:{root} did not end its stream",
                            fix="check that host; run it again", read_out=False)  # fmt: skip
    except BaseException:
        for part in store.glob(f".*.{os.getpid()}.{threading.get_ident()}.part"):
            part.unlink(missing_ok=True)
        child.check()
        raise
    if code != 0:
        raise failure(where, root, code, err.decode(errors="replace"))
    held = {h for _, h in wanted.values() if object_path(store, h).exists()}
    return held, missed


def put(where: Where, root: str, files: Sequence[tuple[str, str, str | None]], store: Path) -> dict[str, Any]:
    """Each ``(name, hash, replaces)`` onto the node from ``store``: written only where the name is free, or holds
    the content ``replaces`` (one nodekit put there). The node's answer: ``placed`` and ``skipped`` (with why)."""
    sizes = [object_path(store, h).stat().st_size for _, h, _ in files]
    entries = [[n, size, h, r] for (n, h, r), size in zip(files, sizes, strict=True)]
    total = sum(sizes)
    child = proc.start(where.argv("put", root), deadline=proc.Stall(STALL_S),
                       what=f"the hand-off to {where.name}:{root}", fix="check the link to that host",
                       stdin="pipe", stdout="pipe", stderr="pipe", group=True)  # fmt: skip

    def feed() -> None:
        assert child.stdin is not None
        with child.waiting():
            child.stdin.write(bundle() + block(json.dumps({"files": entries}).encode()))
        for (_, h, _), size in zip(files, sizes, strict=True):
            with child.waiting():
                child.stdin.write(f"{size}\n".encode())
            with open(object_path(store, h), "rb") as f:
                while chunk := f.read(1 << 20):
                    with child.waiting():
                        child.stdin.write(chunk)
        with child.waiting():
            child.stdin.close()

    code, out, err = talk(child, feed, SCAN_BASE_S + total / HASH_RATE,
                          late=f"{where.name} did not finish the hand-off", fix="check that host's disk")  # fmt: skip
    if code != 0:
        raise failure(where, root, code, err.decode(errors="replace"))
    answer = json.loads(out.decode().strip().splitlines()[-1])
    assert isinstance(answer, dict)
    return answer
