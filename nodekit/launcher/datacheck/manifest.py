"""Same data on every node: a manifest of a mounted directory, its digest, and where two manifests first differ.

Standard library only. A manifest is every regular file under the root as ``(relative path, size, hash)``, sorted
by path; ``hash`` is the file's sha256 when content hashes were asked for, else empty. nodekit's own state beside a
pushed dataset (``.nodekit-data`` at the top) is left out. Symbolic links are listed with their target instead of
being followed (a link out of the tree would otherwise make the walk unbounded).
The preflight compares each node's digest with node 0's and, when they differ, names the first differing files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from nodekit.launcher.datacheck.filehash import CHUNK

STATE_DIR = ".nodekit-data"
"""nodekit's own state beside a pushed dataset (datasync/ keeps it there): it differs per node by design (inodes,
times), so no manifest lists it, and no dataset may name a file in it."""
HASH_THREADS = max(4, min(16, 2 * (os.cpu_count() or 1)))  # hashlib releases the GIL on large updates
# Files larger than this are hashed in pieces of this size in parallel (sha256 over the pieces' digests): one big
# file would otherwise be hashed by a single core, slower than a fast disk reads it.
PIECE = 32 << 20


@dataclass(frozen=True)
class Entry:
    path: str  # relative, '/'-separated
    size: int
    hash: str = ""  # sha256 hex with content hashes, "->target" for a link, else ""

    def line(self) -> str:
        return f"{self.path}\t{self.size}\t{self.hash}"


def _walk(root: str, rel: str = "") -> Iterator[tuple[str, str, int, str]]:
    """(relative path, absolute path, size, link target or "") for every file and link under ``root``."""
    with os.scandir(os.path.join(root, rel) if rel else root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        name = f"{rel}/{e.name}" if rel else e.name
        if not rel and e.name == STATE_DIR:
            continue  # what `nodekit data push` keeps beside a dataset differs per node by design (inodes, times)
        if e.is_symlink():
            yield name, e.path, 0, os.readlink(e.path)
        elif e.is_dir(follow_symlinks=False):
            yield from _walk(root, name)
        elif e.is_file(follow_symlinks=False):
            yield name, e.path, e.stat(follow_symlinks=False).st_size, ""


def _piece_sha256(task: tuple[str, int, int]) -> bytes:
    path, offset, length = task
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left > 0 and (chunk := f.read(min(CHUNK, left))):
            h.update(chunk)
            left -= len(chunk)
    return h.digest()


BATCH_FILES = 64
BATCH_BYTES = 8 << 20
"""Small files go to the hashing threads in batches of up to this many files and bytes: handing a thread one small
file costs about as much CPU as hashing it."""


def _batch_sha256(tasks: Sequence[tuple[str, int, int]]) -> list[bytes]:
    return [_piece_sha256(t) for t in tasks]


def content_hashes(files: Sequence[tuple[str, int]], threads: int = HASH_THREADS) -> list[str]:
    """The content hash of each ``(path, size)``: sha256 of the file, or for a file over :data:`PIECE` bytes
    ``p:`` + sha256 over its pieces' sha256 digests. Every piece of every file is hashed in one thread pool, each
    big file's piece on its own and small files in batches."""
    owners: list[int] = []  # whose digest each task gives, in the order of the batches' tasks
    batches: list[list[tuple[str, int, int]]] = []
    small, batch_bytes = False, 0  # whether the last batch takes small files, and its bytes
    for i, (path, size) in enumerate(files):
        if size > PIECE:
            batches += [[(path, off, PIECE)] for off in range(0, size, PIECE)]
            owners += [i] * len(range(0, size, PIECE))
            small = False
            continue
        if not small or len(batches[-1]) >= BATCH_FILES or batch_bytes + size > BATCH_BYTES:
            batches.append([])
            small, batch_bytes = True, 0
        batches[-1].append((path, 0, 1 << 62))  # small: to the end, as filehash.file_sha256
        batch_bytes += size
        owners.append(i)
    with ThreadPoolExecutor(threads) as pool:
        digests = [d for ds in pool.map(_batch_sha256, batches) for d in ds]
    parts: list[list[bytes]] = [[] for _ in files]
    for i, d in zip(owners, digests, strict=True):
        parts[i].append(d)
    out = []
    for (_, size), p in zip(files, parts, strict=True):
        out.append("p:" + hashlib.sha256(b"".join(p)).hexdigest() if size > PIECE else p[0].hex())
    return out


def copy_hashing(src: BinaryIO, out: BinaryIO, size: int) -> str:
    """Copy exactly ``size`` bytes, returning their content hash as :func:`content_hashes` makes it (pieces of
    :data:`PIECE`); EOFError if ``src`` ends sooner."""
    whole, piece, pieces, in_piece, left = hashlib.sha256(), hashlib.sha256(), [], 0, size
    while left > 0:
        chunk = src.read(min(CHUNK, left, PIECE - in_piece))
        if not chunk:
            raise EOFError(f"the source ended {left} bytes short")
        out.write(chunk)
        (whole if size <= PIECE else piece).update(chunk)
        left -= len(chunk)
        in_piece += len(chunk)
        if in_piece == PIECE or (left == 0 and size > PIECE):
            pieces.append(piece.digest())
            piece, in_piece = hashlib.sha256(), 0
    if size > PIECE:
        return "p:" + hashlib.sha256(b"".join(pieces)).hexdigest()
    return whole.hexdigest()


def manifest(root: str, *, hashes: bool = False) -> tuple[Entry, ...]:
    """The manifest of ``root`` (see the module docstring), or of the one file ``root`` names (a mount of one file);
    OSError when ``root`` cannot be read."""
    if os.path.isfile(root):
        found = [(os.path.basename(root), root, os.path.getsize(root), "")]
    else:
        found = sorted(_walk(root), key=lambda t: t[0])
    if not hashes:
        return tuple(Entry(p, size, f"->{link}" if link else "") for p, _, size, link in found)
    digests = iter(content_hashes([(a, size) for _, a, size, link in found if not link]))
    return tuple(Entry(p, size, f"->{link}" if link else next(digests)) for p, _, size, link in found)


def digest(entries: Sequence[Entry]) -> str:
    """One sha256 over the manifest: equal digests mean equal file lists, sizes (and contents, when hashed)."""
    h = hashlib.sha256()
    for e in entries:
        h.update(e.line().encode("utf-8", "surrogateescape"))
        h.update(b"\n")
    return h.hexdigest()


def to_text(entries: Sequence[Entry]) -> str:
    return "".join(e.line() + "\n" for e in entries)


def from_text(text: str) -> tuple[Entry, ...]:
    out = []
    for line in text.splitlines():
        path, size, h = line.split("\t")
        out.append(Entry(path, int(size), h))
    return tuple(out)


def first_differences(ours: Sequence[Entry], theirs: Sequence[Entry], limit: int = 3) -> list[str]:
    """Up to ``limit`` descriptions of where ``theirs`` differs from ``ours``, in path order:
    ``a/b.jpg: size 10 vs 12``, ``c.txt: only on node 0``, ``d.txt: content differs``."""
    a = {e.path: e for e in ours}
    b = {e.path: e for e in theirs}
    out = []
    for path in sorted(a.keys() | b.keys()):
        x, y = a.get(path), b.get(path)
        if x is None:
            out.append(f"{path}: missing on main")
        elif y is None:
            out.append(f"{path}: missing")
        elif x.size != y.size:
            out.append(f"{path}: {y.size} bytes, main has {x.size}")
        elif x.hash != y.hash:
            out.append(f"{path}: content differs")
        else:
            continue
        if len(out) >= limit:
            break
    return out
