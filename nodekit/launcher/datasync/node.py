"""What a node's target holds: nodekit's state file (every file it put there, with the hash cache), the scan the
head plans from, and the final check against the source's manifest. Standard library only.

The state file, ``<target>/.nodekit-data/state.json``, lists each name nodekit wrote under the target with
``[size, mtime_ns, inode, hash]``. Before any file is renamed into place its name is recorded there (with no hash:
the next scan reads it again), so a push killed at any point leaves no file nodekit put there that it does not
know of. Anything else under the target is the user's: never overwritten, never deleted.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import Any

from nodekit.launcher.datacheck.manifest import content_hashes
from nodekit.launcher.datasync.names import STATE_DIR, hash_problem
from nodekit.launcher.datasync.scan import Cache, Manifest, hashed, walk

STATE = "state.json"
STAGING = "staging"


def state_path(root: str, only: str | None = None) -> str:
    """``only``: a file target, the one name under ``root`` it manages. Its state and staging are its own, so that
    two file targets in one directory, pushed at once, never share (or remove) each other's."""
    return os.path.join(root, STATE_DIR, STATE if only is None else f"file.{only}.json")


def staging_dir(root: str, only: str | None = None) -> str:
    return os.path.join(root, STATE_DIR, STAGING if only is None else f"{STAGING}.{only}")


def load_state(root: str, only: str | None = None) -> Cache:
    """The files nodekit put under ``root`` (name -> cache entry); empty when there is no state yet."""
    try:
        with open(state_path(root, only), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    files = data.get("files", {}) if isinstance(data, dict) else {}
    return files if isinstance(files, dict) else {}  # entries are checked where they are used (scan.hashed)


def save_state(root: str, files: Mapping[str, list[object]], only: str | None = None) -> None:
    """Written whole to a new file, flushed to disk, then renamed over the old one: a crash leaves one or the other."""
    os.makedirs(os.path.join(root, STATE_DIR), exist_ok=True)
    tmp = state_path(root, only) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        # dumps, not dump: json.dump encodes in pure Python, ten times slower on a state of 100,000 files
        f.write(json.dumps({"version": 1, "files": dict(sorted(files.items()))}, separators=(",", ":")))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_path(root, only))


def kind(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return "f"
    if stat.S_ISLNK(st.st_mode):
        return "l"
    return "o"  # a device, FIFO or socket


def free_bytes(root: str) -> int:
    """Bytes free to an unprivileged writer at ``root``, or at its nearest existing parent."""
    path = root
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _entries(root: str, only: str | None) -> list[tuple[str, os.stat_result]]:
    """What a target holds: every entry under the directory, or a file target's one name (its neighbours are not
    looked at: they are not the dataset's)."""
    if only is None:
        return list(walk(root)) if os.path.isdir(root) else []
    try:
        return [(only, os.lstat(os.path.join(root, only)))]
    except (FileNotFoundError, NotADirectoryError):
        return []


def held(
    root: str, only: str | None = None, *, cached: bool = True, owned: Cache | None = None
) -> tuple[Manifest, dict[str, list[Any]], Cache]:
    """What nodekit's files under ``root`` hold now (name -> (size, hash); a name of the state that is missing or no
    longer a regular file is left out), every other entry under ``root`` (name -> [size, kind]), and the new cache.
    ``cached=False``: every file is read again, whatever the state's hashes say. ``owned``: the state as the caller
    holds it, not yet saved (an apply's, whose placed files' entries it has just made); else the saved one."""
    owned = load_state(root, only) if owned is None else owned
    mine, foreign = [], {}
    for name, st in _entries(root, only):
        if name in owned:
            if stat.S_ISREG(st.st_mode):
                mine.append((name, st))
        else:
            foreign[name] = [st.st_size, kind(st)]
    manifest, cache = hashed(root, mine, owned if cached else {})
    return manifest, foreign, cache


def staged(root: str, only: str | None = None) -> dict[str, int]:
    """Contents a killed push left complete in staging (hash -> size), each read again to prove its name."""
    d = staging_dir(root, only)
    try:
        names = sorted(n for n in os.listdir(d) if hash_problem(n.replace("_", ":")) is None)
    except FileNotFoundError:
        return {}
    paths = [(os.path.join(d, n), os.stat(os.path.join(d, n)).st_size) for n in names]
    got = content_hashes(paths) if paths else []
    return {
        n.replace("_", ":"): size for n, (_, size), h in zip(names, paths, got, strict=True) if h == n.replace("_", ":")
    }


def scan(root: str, want: Manifest, only: str | None = None) -> dict[str, Any]:
    """The head's view of this node (JSON): ``owned`` (what nodekit's files hold, less what equals ``want``: of an
    unchanged dataset nothing, not the manifest again), ``unequal`` (the names of ``want`` that nodekit's files do
    not hold as ``want`` has them; every other name of ``want`` is owned and equal), ``foreign`` (everything else
    under the target; a regular file at a name the source also has, of its size, with its hash so the head can tell
    whether it is the source's), ``staged`` and ``free`` bytes."""
    owned, foreign, _ = held(root, only)
    candidates = [n for n, (size, k) in foreign.items() if k == "f" and n in want and want[n][0] == size]
    for n, h in zip(
        candidates, content_hashes([(os.path.join(root, n), foreign[n][0]) for n in candidates]), strict=True
    ):
        foreign[n].append(h)
    return {
        "owned": {n: list(v) for n, v in owned.items() if want.get(n) != v},
        "unequal": [n for n, v in want.items() if owned.get(n) != v],
        "foreign": foreign,
        "staged": staged(root, only),
        "free": free_bytes(root),
    }


def verify(root: str, want: Manifest, only: str | None = None) -> dict[str, Any]:
    """Every file of the target read again from its disk, no cache trusted, and compared with ``want``. What was
    read replaces the state's hashes: a file changed under the same size, time and inode (bit rot, a byte rewritten
    and its time set back), which every cache trusts, is then sent again by the next push."""
    have, foreign, cache = held(root, only, cached=False)
    owned = load_state(root, only)
    if owned and any(cache.get(n, v) != v for n, v in owned.items()):
        save_state(root, {n: cache.get(n, v) for n, v in owned.items()}, only)
    diffs = differences(want, have, foreign)
    return {"ok": not diffs, "diffs": diffs, "files": len(have), "bytes": sum(s for s, _ in have.values())}


def differences(want: Manifest, have: Manifest, foreign: Mapping[str, object], limit: int = 3) -> list[str]:
    """Up to ``limit`` names where the target differs from the source, in name order, each saying how."""
    out = []
    for name in sorted(want.keys() | have.keys() | foreign.keys()):
        w, h = want.get(name), have.get(name)
        if name in foreign:
            out.append(f"{name}: not put there by nodekit")
        elif h is None:
            out.append(f"{name}: missing")
        elif w is None:
            out.append(f"{name}: not in the source")
        elif w[0] != h[0]:
            out.append(f"{name}: {h[0]} bytes, the source has {w[0]}")
        elif w[1] != h[1]:
            out.append(f"{name}: content differs")
        else:
            continue
        if len(out) >= limit:
            break
    return out
