"""A node's output directory, read and written for the head: ``list`` (every file with its content hash; the hash
cache is the head's, sent with the request, so nothing of nodekit's is left in the job's directory), ``send`` (the
files the head asks for, as one stream) and ``put`` (files the head hands over, each written in staging, hashed as
written, and renamed into place only when its hash is the one announced). Standard library only; run by the host's
``python3`` through :mod:`nodekit.data.transport`'s boot, as the dataset receiver is.

Used by ``nodekit data gather`` (list, send) and by the restart hand-off of ``nodekit run`` (list, send, put).
``put`` never overwrites a file unless the head names the content it expects there (one nodekit itself put there
earlier); a name that fails :func:`~nodekit.launcher.datasync.names.name_problem`, or whose parent on the node is a
link or a file, refuses the whole request before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO

from nodekit.launcher.datacheck.filehash import CHUNK
from nodekit.launcher.datasync.names import STATE_DIR, hash_problem, name_problem
from nodekit.launcher.datasync.receive import Broken, Refused, _copy_hashing, read_block
from nodekit.launcher.datasync.scan import hashed, walk

PUT_DIR = "put"
SKIPPED = -1
"""A ``send`` frame's size when the file is gone or changed since the listing: no bytes follow."""


def listing(root: str, cache: Mapping[str, list[object]], exclude: list[str]) -> dict[str, Any]:
    """Every regular file under ``root`` (name -> [size, mtime_ns, inode, hash]), hashes from ``cache`` where its
    keys still match; links, devices and names that could not be written elsewhere are ``skipped`` (with why)."""
    if not os.path.isdir(root):
        return {"files": {}, "skipped": []}
    found, skipped = [], []
    for name, st in walk(root):
        if name.split("/", 1)[0] in exclude:
            continue
        if (problem := name_problem(name)) is not None:
            skipped.append(problem)
        elif not stat.S_ISREG(st.st_mode):
            skipped.append(f"{name} is a link or a special file")
        else:
            found.append((name, st))
    _, new = hashed(root, found, cache)
    return {"files": new, "skipped": skipped}


def send(root: str, wanted: list[list[Any]], out: BinaryIO) -> None:
    """Each ``[name, size, hash]`` as ``<size>\\n`` and its bytes, in order; ``-1`` for one that is gone, no longer a
    regular file of that size. The head hashes what arrives: a file rewritten meanwhile fails there, not here."""
    for name, size, _ in wanted:
        if name_problem(name) is not None:
            raise Refused(f"asked for {name!r}")
        try:
            fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            out.write(f"{SKIPPED}\n".encode())
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                out.write(f"{SKIPPED}\n".encode())
                continue
            out.write(f"{size}\n".encode())
            left = size
            while left > 0:
                chunk = f.read(min(CHUNK, left)) or b"\0" * min(CHUNK, left)  # shrank: the hash fails at the head
                out.write(chunk)
                left -= len(chunk)
    out.flush()


def _parent_problem(root: str, name: str) -> str | None:
    parts = name.split("/")
    for i in range(1, len(parts)):
        try:
            st = os.lstat(os.path.join(root, *parts[:i]))
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return f"{'/'.join(parts[:i])} on the node is a link or a file, where {name} needs a directory"
    return None


def put_refusal(root: str, files: list[list[Any]]) -> str | None:
    """Why the whole ``put`` request must be refused before anything is written, or None."""
    for entry in files:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[1], int) and entry[1] >= 0):
            return f"a bad entry {str(entry)[:80]!r}"
        name, _, h, replaces = entry
        if (problem := name_problem(name) or hash_problem(h)) is not None:
            return problem
        if replaces is not None and (problem := hash_problem(replaces)) is not None:
            return problem
        if name.split("/", 1)[0] == STATE_DIR:
            return f"{name!r} is inside nodekit's own {STATE_DIR}"
        if (problem := _parent_problem(root, name)) is not None:
            return problem
    return None


def _current(path: str) -> str | None:
    """The content hash of the regular file at ``path``; None when there is none; "" for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        with open(os.devnull, "wb") as sink:
            return _copy_hashing(f, sink, os.fstat(f.fileno()).st_size)


def put(root: str, f: BinaryIO) -> dict[str, Any]:
    """Read the request (``files``: ``[name, size, hash, replaces]``) and each file's frame; place each one whose
    bytes hash to its announced hash and whose name is free (or holds ``replaces``). The names placed, and the
    others with why."""
    request = json.loads(read_block(f))
    files = request.get("files") if isinstance(request, dict) else None
    if not isinstance(files, list):
        raise Refused("the request has no files")
    if (problem := put_refusal(root, files)) is not None:
        raise Refused(problem)
    stage = os.path.join(root, STATE_DIR, PUT_DIR)
    os.makedirs(stage, exist_ok=True)
    placed, skipped = [], []
    try:
        for i, (name, size, h, replaces) in enumerate(files):
            line = f.readline(32)
            if not line.strip().isdigit() or int(line) != size:
                raise Broken(f"a frame that the request does not announce: {line[:40]!r}")
            part = os.path.join(stage, f"{i}.part")
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                got = _copy_hashing(f, out, size)
            dest = os.path.join(root, name)
            now = _current(dest)
            why = ("arrived damaged" if got != h else "is there already" if now is not None and now != replaces
                   else None)  # fmt: skip
            if why is not None:
                os.unlink(part)
                skipped.append([name, why])
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if (problem := _parent_problem(root, name)) is not None:  # a link planted while the frame arrived
                os.unlink(part)
                skipped.append([name, problem])
                continue
            os.replace(part, dest)
            placed.append(name)
    finally:
        for n in os.listdir(stage):
            os.unlink(os.path.join(stage, n))
        os.rmdir(stage)
        with contextlib.suppress(OSError):  # a dataset's state may live there too
            os.rmdir(os.path.join(root, STATE_DIR))
    return {"placed": placed, "skipped": skipped}


def main(argv: list[str], stdin: BinaryIO | None = None, stdout: Any = None) -> int:
    """``list ROOT``, ``send ROOT`` or ``put ROOT``; list and put answer one JSON line, send streams its frames."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    mode, root = argv[0], argv[1]
    try:
        request = json.loads(read_block(stdin)) if mode != "put" else None
        if mode == "list":
            assert isinstance(request, dict)
            answer = listing(root, request.get("cache", {}), list(request.get("exclude", [])))
        elif mode == "send":
            assert isinstance(request, dict)
            send(root, list(request.get("files", [])), stdout.buffer if hasattr(stdout, "buffer") else stdout)
            return 0
        else:
            answer = put(root, stdin)
    except (Refused, Broken) as e:
        print(f"nodekit-data: {'refused' if isinstance(e, Refused) else 'stream broken'}: {e}", file=sys.stderr)
        return e.code
    stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
    stdout.flush()
    return 0
