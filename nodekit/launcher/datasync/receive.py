"""The receiver: run on a node with the target (a mount's host path) as its argument, it answers a scan or applies
a plan and its stream. Standard library only; started by :mod:`nodekit.data.transport` through the host's python3.

An apply reads, on standard input, one block (the plan as JSON: the source's manifest ``want``, the names to
``adopt`` and ``delete``, the contents to copy from names the node holds, the contents ``incoming`` and where each
content is ``place``\\ d), then the stream: per incoming content a line ``<hash> <size>`` and that many bytes, then
``END``; a content the plan names ``passing`` (a relay tree's stream carries it for other nodes) is read past.
Every name in the plan is checked before anything is written (:func:`refusal`): one that is not a plain relative UTF-8
path, one whose parent on the node is a link or a file nodekit did not write, a device or link
entry, one that would overwrite or delete a file nodekit did not put there: the whole plan is refused, nothing is
written. Contents land in ``<target>/.nodekit-data/staging`` as ``.part`` files, hashed as they are written, and are
renamed to their hash only when it matches; files reach their names by rename from there. The result is the
target's manifest compared with ``want``: exit 0, or :data:`DIFFERS` naming the first differing names.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any, BinaryIO, cast

from nodekit.launcher.datacheck.manifest import content_hashes, copy_hashing
from nodekit.launcher.datasync.frames import BROKEN as BROKEN
from nodekit.launcher.datasync.frames import Broken as Broken
from nodekit.launcher.datasync.frames import Reader, receive, staged_name
from nodekit.launcher.datasync.names import hash_problem, name_problem
from nodekit.launcher.datasync.node import differences, held, load_state, save_state, scan, staging_dir, verify
from nodekit.launcher.datasync.scan import Manifest, key

REFUSED = 3
DIFFERS = 4
MAX_BLOCK = 1 << 30


class Refused(Exception):
    code = REFUSED


def read_block(f: BinaryIO) -> bytes:
    """A block: its length as a decimal line, then that many bytes."""
    line = f.readline(32)
    if not line.strip().isdigit() or int(line) > MAX_BLOCK:
        raise Broken("the stream does not start with a block length")
    data = f.read(int(line))
    if len(data) != int(line):
        raise Broken("the stream ended inside a block")
    return data


def _want(plan: Mapping[str, Any]) -> Manifest:
    want = plan.get("want")
    if not isinstance(want, dict):
        raise Refused("the plan has no manifest")
    out: Manifest = {}
    for name, v in want.items():
        if not (isinstance(v, list) and len(v) == 3 and isinstance(v[0], int) and v[0] >= 0):
            raise Refused(f"{name!r}: a bad manifest entry")
        if v[2] != "f":
            raise Refused(f"{name!r}: only regular files are received, not a {'link' if v[2] == 'l' else v[2]!r}")
        out[name] = (v[0], v[1])
    return out


def _parents_problem(root: str, name: str, deleting: set[str], modes: dict[str, int | None]) -> str | None:
    """Why writing ``name`` would leave the target: a parent that is a link, or a file nodekit will not delete.
    ``modes``: each parent's ``lstat`` mode (None: missing), looked up once per directory, not once per file."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent not in modes:
            try:
                modes[parent] = os.lstat(os.path.join(root, parent)).st_mode
            except FileNotFoundError:
                modes[parent] = None
        if (mode := modes[parent]) is None:
            return None
        if stat.S_ISLNK(mode):
            return f"{parent} on the node is a link: {name} would be written through it"
        if not stat.S_ISDIR(mode) and parent not in deleting:
            return f"{parent} on the node is a file nodekit did not write, where {name} needs a directory"
    return None


def refusal(root: str, plan: Mapping[str, Any], owned: Mapping[str, object], only: str | None = None) -> str | None:
    """Why the whole ``plan`` must be refused before anything is written, or None."""
    try:
        want = _want(plan)
    except Refused as e:
        return str(e)
    place, delete, adopt = plan.get("place", {}), plan.get("delete", []), plan.get("adopt", [])
    copy, incoming, passing = plan.get("copy", {}), plan.get("incoming", {}), plan.get("passing", {})
    if not (isinstance(place, dict) and isinstance(delete, list) and isinstance(adopt, list)
            and isinstance(copy, dict) and isinstance(incoming, dict) and isinstance(passing, dict)):  # fmt: skip
        return "the plan is not well formed"
    for name in [*want, *place, *delete, *adopt, *copy.values()]:
        if (problem := name_problem(name)) is not None:
            return problem
        if only is not None and name != only:
            return f"{name!r} is not the file target's one name {only!r}"
    for h in [*(v[1] for v in want.values()), *place.values(), *copy, *incoming, *passing]:
        if (problem := hash_problem(h)) is not None:
            return problem
    if not all(isinstance(s, int) and s >= 0 for s in [*incoming.values(), *passing.values()]):
        return "a bad incoming size"
    deleting = set(delete)
    if stray := next((n for n in delete if n not in owned), None):
        return f"{stray} was not put there by nodekit: it is never deleted"
    for name, h in place.items():
        if name not in want or want[name][1] != h:
            return f"{name}: placed content is not the manifest's"
    modes: dict[str, int | None] = {}
    for name in [*place, *delete, *adopt, *copy.values()]:
        if (problem := _parents_problem(root, name, deleting, modes)) is not None:
            return problem
    for name in [*adopt, *copy.values()]:  # read on the node: a link there could read from anywhere
        try:
            regular = stat.S_ISREG(os.lstat(os.path.join(root, name)).st_mode)
        except FileNotFoundError:
            regular = False
        if not regular:
            return f"{name} on the node is not a regular file"
    for name in place:
        parent = name.rpartition("/")[0]
        if parent and modes.get(parent, 0) is None:
            continue  # its directory is not there yet: neither is it
        try:
            st = os.lstat(os.path.join(root, name))
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            return f"{name} on the node is a directory, where the source has a file"
        if name not in owned and name not in deleting:
            return f"{name} on the node was not put there by nodekit: it is never overwritten"
    return None


def _copy_hashing(src: BinaryIO, out: BinaryIO, size: int) -> str:
    """:func:`~nodekit.launcher.datacheck.manifest.copy_hashing`, a source that ends short being a broken stream."""
    try:
        return copy_hashing(src, out, size)
    except EOFError as e:
        raise Broken(f"the stream ended short of a content ({e})") from None


def _copy_local(root: str, stage: str, copy: Mapping[str, str], going: set[str], owned: Mapping[str, object]) -> None:
    """Each content the node holds into staging: copied and hashed, or linked where its name is being deleted (a
    rename at the source), which its state entry proves unchanged since the scan, as a no-change push trusts it."""
    for h, name in sorted(copy.items()):
        dest = os.path.join(stage, staged_name(h))
        if os.path.exists(dest):
            continue
        src = os.path.join(root, name)
        entry = owned.get(name)
        if name in going and isinstance(entry, list) and entry[3:] == [h] and entry[:3] == key(os.lstat(src)):
            try:
                os.link(src, dest)
                continue
            except OSError:
                pass  # a file system without hard links: copied
        with open(src, "rb") as f, open(dest + ".part", "wb") as out:
            got = _copy_hashing(f, out, os.fstat(f.fileno()).st_size)
        if got != h:
            os.unlink(dest + ".part")
            raise Broken(f"{name} changed on the node during the push")
        os.replace(dest + ".part", dest)


def _prune(root: str, name: str) -> None:
    """Remove the directories above ``name`` that its deletion left empty, up to the target."""
    parent = os.path.dirname(name)
    while parent:
        try:
            os.rmdir(os.path.join(root, parent))
        except OSError:
            return
        parent = os.path.dirname(parent)


def _mkdirs(root: str, name: str, made: set[str]) -> None:
    """The directories above ``name``; ``made``: those this push made or found already (each looked at once)."""
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        rel = "/".join(parts[:i])
        if rel in made:
            continue
        d = os.path.join(root, rel)
        try:
            os.mkdir(d)
        except FileExistsError:
            if stat.S_ISLNK(os.lstat(d).st_mode):
                raise Refused(f"{rel} became a link during the push") from None
        made.add(rel)


def apply(root: str, f: BinaryIO, only: str | None = None, stream: Reader | None = None) -> dict[str, Any]:
    """Carry out the plan read from ``f`` (see the module docstring); the result, or Refused/Broken. ``only``: a
    file target's one name under ``root`` (its state and staging are its own, its neighbours never looked at).
    ``stream``: where the frames come from after the plan, when not from ``f``."""
    try:
        plan = json.loads(read_block(f))
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused(f"the plan is not JSON: {e}") from None
    if not isinstance(plan, dict):
        raise Refused("the plan is not an object")
    owned, stage = load_state(root, only), staging_dir(root, only)
    if (problem := refusal(root, plan, owned, only)) is not None:
        raise Refused(problem)
    want = _want(plan)
    place: dict[str, str] = plan["place"]
    adopt = plan.get("adopt", [])
    adopted = content_hashes([(os.path.join(root, n), want[n][0]) for n in adopt]) if adopt else []
    if bad := next((n for n, h in zip(adopt, adopted, strict=True) if h != want[n][1]), None):
        raise Refused(f"{bad} on the node was not put there by nodekit and differs from the source")
    os.makedirs(stage, exist_ok=True)
    for n in os.listdir(stage):
        if n.endswith(".part") or n.startswith("copy."):
            os.unlink(os.path.join(stage, n))
    # Names first: a push killed from here on leaves nothing nodekit does not know it wrote.
    intent: dict[str, list[object]] = {**owned, **{n: [None, None, None, ""] for n in [*place, *adopt]}}
    save_state(root, intent, only)
    # Standard input's binary stream is a BufferedReader (typing's BinaryIO names no readinto).
    frames = stream or cast(Reader, f)
    received = receive(stage, frames, plan.get("incoming", {}), plan.get("passing", {}))
    _copy_local(root, stage, plan.get("copy", {}), set(plan.get("delete", [])), owned)
    for name in plan.get("delete", []):
        path = os.path.join(root, name)
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            os.unlink(path)
        intent.pop(name, None)
        _prune(root, name)
    uses = Counter(place.values())
    made: set[str] = set()
    for i, (name, h) in enumerate(sorted(place.items())):
        _mkdirs(root, name, made)
        staged = os.path.join(stage, staged_name(h))
        uses[h] -= 1
        if uses[h] > 0:
            tmp = os.path.join(stage, f"copy.{i}")
            shutil.copyfile(staged, tmp)
            staged = tmp
        dest = os.path.join(root, name)
        os.replace(staged, dest)
        intent[name] = [*key(os.lstat(dest)), h]
    shutil.rmtree(stage, ignore_errors=True)
    # One save for the placed files, after the final scan: until then the state names each of them (saved above,
    # before the first rename), so a push killed here leaves none unknown; the next scan only reads them again.
    have, foreign, cache = held(root, only, owned=intent)
    save_state(root, {n: cache.get(n, v) for n, v in intent.items()}, only)
    diffs = differences(want, have, foreign)
    return {"ok": not diffs, "diffs": diffs, "received": received, "files": len(have)}


def main(argv: list[str], stdin: BinaryIO | None = None, stdout: Any = None) -> int:
    """``scan``, ``verify``, ``apply`` or ``relayed`` (an apply whose stream is on fd 3), then ``ROOT [NAME]``
    (NAME: a file target's one file in ROOT); the answer as one JSON line on standard output."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    mode, root, only = argv[0], argv[1], (argv[2] if len(argv) > 2 else None)
    try:
        if only is not None and ((problem := name_problem(only)) is not None or "/" in only):
            raise Refused(problem or f"{only!r}: a file target is one name in its directory")
        if mode in ("scan", "verify"):
            want = {n: (int(v[0]), str(v[1])) for n, v in json.loads(read_block(stdin)).items()}
            answer = (scan if mode == "scan" else verify)(root, want, only)
        elif mode == "relayed":
            # A relay tree's node: its plan on standard input, the stream on fd 3, read straight from the relay
            # step's fifo (a process joining the two would copy every byte once more on every node).
            with io.BufferedReader(io.FileIO(3, "r"), buffer_size=1 << 20) as stream:
                answer = apply(root, stdin, only, stream)
        else:
            answer = apply(root, stdin, only)
    except (Refused, Broken) as e:
        print(f"nodekit-data: {'refused' if isinstance(e, Refused) else 'stream broken'}: {e}", file=sys.stderr)
        return e.code
    stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
    stdout.flush()
    return 0 if answer.get("ok", True) else DIFFERS
