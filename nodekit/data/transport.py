"""Running the receiver (:mod:`nodekit.launcher.datasync.receive`) on a host: through the host's own ``python3``,
over the host's SSH connection (the same ``ssh`` command line as the fleet's checks; under
:class:`nodekit.ship.SharedSsh` it rides the host's one connection), or on this machine for a ``unix://`` target.

Nothing is installed on the host: standard input carries the receiver's modules first (one block of JSON, a few
hundred lines of standard-library Python, which :data:`BOOT` runs from memory), then its input. A scan is one call
with a deadline; an apply streams the plan and every content's bytes in one stream (no round trip per file) under a
:class:`~nodekit.system.proc.Stall` deadline, then waits for the node's verdict under a deadline of its own.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from nodekit.errors import DeadlineError, NodekitError, UsageError
from nodekit.launcher.datacheck.filehash import CHUNK
from nodekit.system import proc, ssh

MODULES = (
    "nodekit.launcher.datacheck.filehash",
    "nodekit.launcher.datacheck.manifest",
    "nodekit.launcher.datasync.names",
    "nodekit.launcher.datasync.scan",
    "nodekit.launcher.datasync.node",
    "nodekit.launcher.datasync.frames",
    "nodekit.launcher.datasync.receive",
    "nodekit.launcher.datasync.outputs",
)
PACKAGES = ("nodekit", "nodekit.launcher", "nodekit.launcher.datacheck", "nodekit.launcher.datasync")
PYTHON = (3, 10)
"""The oldest python3 the receiver runs on (a host's own interpreter; nothing is installed there)."""
TOO_OLD = 6
"""The boot's exit code on an older python3, before it reads anything (the receiver's own codes are 3 to 5)."""
BOOT = (
    "import sys\n"
    f"if sys.version_info<{PYTHON!r}:\n"
    f"    sys.stderr.write('nodekit-data: python3 is %d.%d, the receiver needs {PYTHON[0]}.{PYTHON[1]} or later\\n'"
    "%sys.version_info[:2]);sys.exit(" + str(TOO_OLD) + ")\n"
    "import json,types\n"
    "f=sys.stdin.buffer\n"
    "mods=json.loads(f.read(int(f.readline(32))))\n"
    f"for p in {PACKAGES!r}:\n"
    "    m=types.ModuleType(p);m.__path__=[];sys.modules[p]=m\n"
    "for name,src in mods:\n"
    "    m=types.ModuleType(name);sys.modules[name]=m;exec(compile(src,name,'exec'),m.__dict__)\n"
    # An output directory's modes are the outputs module's (gather, the restart hand-off); a dataset's the receiver's.
    "m='outputs' if sys.argv[1] in ('list','send','put') else 'receive'\n"
    "sys.exit(sys.modules['nodekit.launcher.datasync.'+m].main(sys.argv[1:]))\n"
)
MAX_PARALLEL = 64
T = TypeVar("T")
R = TypeVar("R")
SSH_TIMEOUT_S = 10
STALL_S = 120.0
"""A stream that cannot move for this long has hung (the node's disk, or the link)."""
SCAN_BASE_S = 120.0
HASH_RATE = 100 << 20
"""Bytes a node hashes per second at the least, for deadlines: a scan that reads every byte again (a first push
into a directory that holds the data already) may take this long."""

REFUSED, DIFFERS, BROKEN = 3, 4, 5


class DataError(NodekitError):
    """A host's copy of a dataset could not be made equal to the source."""

    exit_code = 1


def at_once(fn: Callable[[T], R], items: Sequence[T]) -> list[R | NodekitError]:
    """``fn`` on every item at once (every host is heard from); a NodekitError is returned in its place."""

    def one(x: T) -> R | NodekitError:
        try:
            return fn(x)
        except NodekitError as e:
            return e

    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        return list(pool.map(one, items))


def raise_first(results: Sequence[object], others: str) -> None:
    """The first NodekitError among ``results``, saying how many ``others`` (e.g. "node(s)") failed too."""
    errors = [r for r in results if isinstance(r, NodekitError)]
    if errors:
        if len(errors) > 1:
            errors[0].message += f" (and {len(errors) - 1} other {others} failed)"
        raise errors[0]


class Host(Protocol):
    """What the receiver needs to reach a machine over SSH (a fleet's host is one): the datasets know no backend."""

    @property
    def name(self) -> str: ...
    @property
    def scheme(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def user(self) -> str | None: ...
    @property
    def port(self) -> int | None: ...


class RankedHost(Host, Protocol):
    """A host that is one of the job's nodes (its ``[nodes.R] mounts`` apply)."""

    @property
    def rank(self) -> int: ...


@dataclass(frozen=True)
class Where:
    """A host the receiver runs on: over SSH (``host``), or on this machine (None)."""

    name: str
    host: Host | None = None

    def argv(self, mode: str, root: str, only: str | None = None) -> list[str]:
        words = ["python3", "-c", BOOT, mode, root, *([only] if only is not None else [])]
        if self.host is None:
            if shutil.which("python3") is None:
                raise no_python(self)
            return words
        return ssh.command(self.host.hostname, shlex.join(words), connect_timeout=SSH_TIMEOUT_S, port=self.host.port,
                           user=self.host.user, lend_nothing=True)  # fmt: skip


def block(data: bytes) -> bytes:
    return f"{len(data)}\n".encode() + data


def bundle() -> bytes:
    """The receiver's modules, as :data:`BOOT` reads them."""
    import importlib.util

    mods = []
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        mods.append([name, Path(spec.origin).read_text()])
    return block(json.dumps(mods).encode())


class NoPython(UsageError):
    """A host whose python3, which runs the receiver, is missing or too old. Every host answers a scan before any
    byte travels to any of them, so nothing was written anywhere."""


def no_python(where: Where, version: str | None = None) -> NoPython:
    install = "apt-get install -y python3-minimal"
    if where.host is not None:
        port = f"-p {where.host.port} " if where.host.port else ""
        login = f"{where.host.user}@{where.host.hostname}" if where.host.user else where.host.hostname
        install = f"ssh {port}{login} sudo {install}"
    what = (
        f"has python3 {version}, older than the {PYTHON[0]}.{PYTHON[1]} nodekit needs"
        if version
        else "has no python3, which nodekit needs"
    )
    return NoPython(f"{where.name} {what} there to read and write the files; nothing was sent",
                    fix=f"{install} (Debian, Ubuntu; python3 {PYTHON[0]}.{PYTHON[1]} or later)")  # fmt: skip


def failure(where: Where, root: str, code: int, stderr: str) -> NodekitError:
    """What a receiver's exit code and last words mean, as nodekit's error (its exit code and fix)."""
    said = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "") or f"exit code {code}"
    if code == 127 and ("python3: not found" in stderr or "python3: command not found" in stderr):
        return no_python(where)
    if code == TOO_OLD and said.startswith("nodekit-data: python3 is "):
        return no_python(where, said.removeprefix("nodekit-data: python3 is ").split(",")[0])
    if code == 255:
        return DataError(f"SSH to {where.name} failed: {said}", fix=f"check that ssh to {where.name} works")
    if code == REFUSED:
        return DataError(f"{where.name} refused the dataset for {root}: {said.split(': ', 2)[-1]}",
                         fix="nothing was written there; see the reason")  # fmt: skip
    return DataError(f"the dataset push to {where.name}:{root} failed: {said}",
                     fix="run `nodekit data push` again: it finishes what this one left")  # fmt: skip


def scan(where: Where, root: str, want: Mapping[str, tuple[int, str]], only: str | None = None) -> dict[str, Any]:
    """The host's scan of ``root`` (:func:`nodekit.launcher.datasync.node.scan`), ``owned`` whole again (the node
    leaves out what equals ``want``); ``only``: a file target's name."""
    answer = _ask("scan", where, root, want, only)
    unequal = set(answer.pop("unequal", []))
    answer["owned"] = {**{n: list(v) for n, v in want.items() if n not in unequal}, **answer.get("owned", {})}
    return answer


def verify(where: Where, root: str, want: Mapping[str, tuple[int, str]], only: str | None = None) -> dict[str, Any]:
    """Every file under the host path read again from its disk, no cache trusted, and compared with ``want``
    (:func:`nodekit.launcher.datasync.node.verify`): ``ok``, ``diffs`` (the first differing names, each saying how),
    ``files``, ``bytes``."""
    return _ask("verify", where, root, want, only)


def _ask(mode: str, where: Where, root: str, want: Mapping[str, tuple[int, str]], only: str | None) -> dict[str, Any]:
    payload = json.dumps({n: [s, h] for n, (s, h) in want.items()}).encode()
    deadline = SCAN_BASE_S + sum(s for s, _ in want.values()) / HASH_RATE
    done = proc.run(where.argv(mode, root, only), deadline=deadline, what=f"the dataset {mode} on {where.name}",
                    fix="check the host's disk (this reads files whose size or time changed, or all with verify)",
                    given=bundle() + block(payload))  # fmt: skip
    if done.returncode not in (0, DIFFERS):
        raise failure(where, root, done.returncode, done.stderr)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(answer, dict)
    return answer


def talk(
    child: proc.Child, feed: Callable[[], None], tail_s: float, *, late: str, fix: str, read_out: bool = True
) -> tuple[int, bytes, bytes]:
    """One conversation with a receiver ``child`` started with pipes: ``feed`` writes its input (each blocking
    write under ``child.waiting()``, its stall deadline) while threads read its errors and, with ``read_out``, its
    output (without: ``feed`` reads it); then up to ``tail_s`` seconds for it to exit (DeadlineError: ``late``
    within that). A node that stops reading breaks the pipe: its exit code and errors say why. On any exception,
    Ctrl-C and the deadlines included, the child is killed and reaped first. Its exit code, output and errors."""
    assert child.stdout is not None and child.stderr is not None
    said: dict[str, bytes] = {}
    pipes = [("err", child.stderr), *([("out", child.stdout)] if read_out else [])]
    readers = [threading.Thread(target=lambda k=k, s=s: said.__setitem__(k, s.read()), daemon=True)
               for k, s in pipes]  # fmt: skip
    for t in readers:
        t.start()
    try:
        with contextlib.suppress(BrokenPipeError):  # the node stopped reading: its exit code and errors say why
            feed()
        code = child.wait(tail_s)
        if code is None:
            raise DeadlineError(f"{late} within {tail_s:.0f} s of the stream's end", fix=fix)
        for t in readers:
            t.join(10)
        child.check()
    except BaseException:
        if child.poll() is None:
            child.kill()
            child.wait()
        raise
    return code, said.get("out", b""), said.get("err", b"")


class _Sent:
    def __init__(self) -> None:
        self.bytes = 0


BATCH = 64 << 10
"""Small contents' frames are written together up to this many bytes: a pipe's default capacity. The head reads a
batch's files while the SSH client drains what the pipe holds of the one before; a batch much bigger than the pipe
would leave it empty, and the link idle, for part of that time (a reasoned bound: the cluster runs here could not
tell 64 KiB from 1 MiB apart, their spread being the file system's, see benchmarks/data_bench.py SETTLE_S)."""


def frames(stream: Mapping[str, int], files: Mapping[str, Path]) -> Iterator[tuple[bytes, int]]:
    """The stream as the receiver reads it (each content of ``stream`` read once from ``files``, then ``END``), in
    pieces of at most :data:`CHUNK` bytes or one :data:`BATCH` of small frames, each with the payload bytes in it. A
    small content's frame goes out whole, with its neighbours': a write for its line and one for its bytes would cost
    the head, the SSH client and the node a system call and a wake-up each, 40,000 of each for 20,000 small files.
    Not hashed here: each node hashes what it receives against the plan's hash, so a source file that changed since
    its manifest is refused there (and each host's stream would otherwise cost this machine one more core of
    sha256)."""
    batch: list[bytes] = []
    held = payload = 0  # the batch's bytes, and its contents' bytes
    for h, size in stream.items():
        batch.append(f"{h} {size}\n".encode())
        with open(files[h], "rb") as f:
            if size <= CHUNK:
                batch.append(f.read(size))
                if len(batch[-1]) < size:
                    raise _shrank(files[h])
                held, payload = held + size, payload + size
                if held >= BATCH:
                    yield b"".join(batch), payload
                    batch, held, payload = [], 0, 0
                continue
            yield b"".join(batch), payload
            batch, held, payload, left = [], 0, 0, size
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise _shrank(files[h])
                left -= len(chunk)
                yield chunk, len(chunk)
    yield b"".join([*batch, b"END\n"]), payload


def _shrank(path: Path) -> DataError:
    return DataError(f"{path} shrank while it was sent", fix="push again once it is written")


def _frames(out: IO[bytes], incoming: Mapping[str, int], files: Mapping[str, Path], child: proc.Child,
            sent: _Sent, on_bytes: Callable[[int], None]) -> None:  # fmt: skip
    """:func:`frames` written to ``out``, each write under the child's stall deadline."""
    for chunk, payload in frames(incoming, files):
        with child.waiting():
            out.write(chunk)
        sent.bytes += payload
        on_bytes(payload)


def apply(
    where: Where,
    root: str,
    plan: Mapping[str, Any],
    files: Mapping[str, Path],
    on_bytes: Callable[[int], None] = lambda n: None,
    only: str | None = None,
) -> tuple[dict[str, Any], int]:
    """Carry out ``plan`` on the host: its result and the payload bytes sent. ``files``: for each incoming content,
    the source file that holds it; ``only``: a file target's one name in ``root``."""
    child = proc.start(where.argv("apply", root, only), deadline=proc.Stall(STALL_S),
                       what=f"the dataset push to {where.name}", fix="check the link to that host; push again",
                       stdin="pipe", stdout="pipe", stderr="pipe", group=True)  # fmt: skip
    sent = _Sent()
    incoming: Mapping[str, int] = plan["incoming"]

    def feed() -> None:
        assert child.stdin is not None
        with child.waiting():
            child.stdin.write(bundle() + block(json.dumps(plan).encode()))
        _frames(child.stdin, incoming, files, child, sent, on_bytes)
        with child.waiting():
            child.stdin.close()

    # The node works on after the stream's end (local copies, renames, the final scan): its own deadline.
    tail_s = SCAN_BASE_S + sum(v[0] for v in plan["want"].values()) / HASH_RATE
    code, out, err = talk(child, feed, tail_s, late=f"{where.name} did not finish the dataset push",
                          fix="check that host's disk; push again to finish")  # fmt: skip
    if code not in (0, DIFFERS):
        raise failure(where, root, code, err.decode(errors="replace"))
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result, sent.bytes
