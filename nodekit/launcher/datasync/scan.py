"""A tree's manifest, ``relative name -> (size, content hash)``, with a cache of hashes keyed by
``(size, mtime_ns, inode)`` so that a file that did not change is not read again. Standard library only.

The hash is the datacheck manifest's (:func:`nodekit.launcher.datacheck.manifest.content_hashes`: sha256, or for a
file over 32 MiB sha256 over its pieces' sha256, hashed on threads), so a dataset nodekit placed passes
``check = "hashes"`` by construction. A cache entry is trusted only while all three keys match: a file rewritten in
place changes its mtime, a file replaced by another (a rename over it) changes its inode, a truncated one its size.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping

from nodekit.launcher.datacheck.manifest import content_hashes
from nodekit.launcher.datasync.names import STATE_DIR

Cache = dict[str, list[object]]
"""name -> [size, mtime_ns, inode, hash]: JSON as it is."""
Manifest = dict[str, tuple[int, str]]
"""name -> (size, content hash)."""


def key(st: os.stat_result) -> list[object]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def walk(root: str, rel: str = "") -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root`` that is not a directory (files, links, anything else), by name with its ``lstat``;
    links are never followed, and nodekit's own :data:`STATE_DIR` at the top is left out."""
    with os.scandir(os.path.join(root, rel) if rel else root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        name = f"{rel}/{e.name}" if rel else e.name
        if not rel and e.name == STATE_DIR:
            continue
        st = e.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            yield from walk(root, name)
        else:
            yield name, st


def hashed(
    root: str, found: Iterable[tuple[str, os.stat_result]], cache: Mapping[str, list[object]]
) -> tuple[Manifest, Cache]:
    """The manifest of the regular files ``found`` (name, stat of the bytes' file) under ``root``, and the cache that
    describes it: hashes come from ``cache`` where its keys still match, the rest are read (in one thread pool)."""
    out: Manifest = {}
    new: Cache = {}
    todo: list[tuple[str, os.stat_result]] = []
    for name, st in found:
        old = cache.get(name)
        # Field by field, not old[:3] == key(st): that makes two lists per file, 200,000 for a no-change scan.
        if (isinstance(old, list) and len(old) == 4 and old[0] == st.st_size and old[1] == st.st_mtime_ns
                and old[2] == st.st_ino and isinstance(old[3], str)):  # fmt: skip
            out[name] = (st.st_size, old[3])
            new[name] = old
        else:
            todo.append((name, st))
    digests = content_hashes([(os.path.join(root, n), st.st_size) for n, st in todo]) if todo else []
    for (name, st), h in zip(todo, digests, strict=True):
        out[name] = (st.st_size, h)
        new[name] = [*key(st), h]
    return dict(sorted(out.items())), new


def source_files(root: str) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """The regular files a source directory holds, and the problems that keep it from being sent: a link is sent
    as the file it names when that is a regular file inside ``root`` (the node receives a file, never a link); a
    link out of the tree, to a directory or to nothing, a device, FIFO or socket, and a name that is not valid
    UTF-8 are problems, each named."""
    from nodekit.launcher.datasync.names import name_problem

    real_root = os.path.realpath(root)
    files: list[tuple[str, os.stat_result]] = []
    problems: list[str] = []
    for name, st in walk(root):
        problem = name_problem(name)
        if problem is not None:
            problems.append(problem)
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(os.path.join(root, name))
            inside = os.path.commonpath([real_root, target]) == real_root
            try:
                tst = os.stat(target)
            except OSError:
                problems.append(f"{name} is a link to nothing")
                continue
            if not inside:
                problems.append(f"{name} is a link out of the source ({target})")
            elif not stat.S_ISREG(tst.st_mode):
                problems.append(f"{name} is a link to a directory or special file")
            else:
                files.append((name, tst))
        elif stat.S_ISREG(st.st_mode):
            files.append((name, st))
        else:
            problems.append(f"{name} is not a regular file (a device, FIFO or socket)")
    return files, problems
