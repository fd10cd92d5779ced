"""Images as byte streams, for shipping: ``docker save`` read in chunks, ``docker load`` fed in chunks.

python-on-whales builds the command line here (host, context, TLS and config flags, as for every other call), but
the byte streams run through nodekit.system.proc's processes: its load-from-iterator lets docker's stderr go to the
terminal (a failed load could not say why) and cannot be cut off halfway, and cutting a load off is how a broken
stream is kept from ever completing on a target. A ``docker load`` whose request body ends early registers
nothing, so a target's existing images stay as they were. A signal to nodekit kills both at once (SIGKILL, not
SIGTERM: a ``docker save`` blocked writing into a pipe nobody reads any more would sit out the grace).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import IO

from nodekit.errors import BuildError, ShipError
from nodekit.system import proc
from nodekit.system.docker.calls import docker_argv, stderr_tail, where
from nodekit.system.docker.models import Loaded

CHUNK = 1 << 20
_STREAM = proc.Unbounded("a stream: whoever reads or feeds it closes or cuts it off")
LOAD_STALL_S = 60.0
"""``docker load`` that takes no byte for this long (a wedged engine, a frozen link) is stopped: a write into it
blocked that long. A push also cuts such a target off from its side (nodekit.ship.fanout.STALL_S), so the other
targets go on."""
SAVE_STALL_S = 60.0
"""``docker save`` that gives no byte for this long (a wedged engine, a dead link to ``--from``) is stopped: a stall
deadline, not a total one, so a large image on a slow disk is never cut off while it moves. Read from this module
at every save (a test changes it here)."""


KEEP = 64 << 10
"""What nodekit keeps of a stream it reads only for messages (a process's stderr): its last 64 KiB. A process, or
whatever answers over SSH on a node, can write without end; nodekit's memory must not follow it."""


class Tail:
    """The last ``limit`` bytes of all that is added, however much is: each chunk costs its own length, never a copy
    of everything before it."""

    def __init__(self, limit: int = KEEP) -> None:
        self.limit = limit
        self.cut = False
        """Whether anything was dropped (what is kept then starts in the middle of a line)."""
        self._buf = bytearray()

    def add(self, chunk: bytes) -> None:
        if len(chunk) >= self.limit:
            self.cut = self.cut or bool(self._buf) or len(chunk) > self.limit
            self._buf[:] = chunk[-self.limit :]
            return
        self._buf += chunk
        over = len(self._buf) - self.limit
        if over > 0:
            del self._buf[:over]
            self.cut = True

    def __len__(self) -> int:
        return len(self._buf)

    def text(self) -> str:
        """What is kept, decoded; once something was dropped, from its first whole line on (a line cut at its start
        would read as something it never said), unless there is no other."""
        data = bytes(self._buf)
        if self.cut and 0 <= (nl := data.find(b"\n")) < len(data) - 1:
            data = data[nl + 1 :]
        return data.decode(errors="replace")


class Drain:
    """Collects a pipe in a thread, so a chatty process never blocks on a full pipe while we feed it; keeps its last
    ``keep`` bytes (:class:`Tail`)."""

    def __init__(self, pipe: IO[bytes], keep: int = KEEP) -> None:
        import threading

        self._kept = Tail(keep)
        self._pipe = pipe
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        read = getattr(self._pipe, "read1", self._pipe.read)  # what has arrived, without waiting for a full block
        for chunk in iter(lambda: read(1 << 16), b""):
            self._kept.add(chunk)

    def text(self, timeout: float = 10.0) -> str:
        self._thread.join(timeout)
        return self._kept.text()


class SaveStream:
    """The bytes of ``docker save REF`` on ``host``, in chunks. Iterating to the end raises ShipError when
    docker save fails (its last stderr line says why); ``close`` stops it early."""

    def __init__(self, ref: str, host: str | None = None) -> None:
        self.ref = ref
        self.host = host
        fix = f"check that engine (docker{' -H ' + host if host else ''} info; restart dockerd if it does not answer)"
        self._proc = proc.start(docker_argv(host, "image", "save", ref), stdin="devnull", stdout="pipe",
                                stderr="pipe", deadline=proc.Stall(SAVE_STALL_S), group=True, stop_with=signal.SIGKILL,
                                what=f"docker save {ref} on {where(host)}", fix=fix)  # fmt: skip
        assert self._proc.stderr is not None
        self._stderr = Drain(self._proc.stderr)

    def __iter__(self) -> Iterator[bytes]:
        """DeadlineError when the save stood still for :data:`SAVE_STALL_S`."""
        out = self._proc.stdout
        assert out is not None
        while True:
            with self._proc.waiting():
                chunk = out.read(CHUNK)
            if not chunk:
                break
            yield chunk
        code = self._proc.wait()
        self._proc.check()
        if code != 0:
            raise ShipError(f"docker save {self.ref} on {where(self.host)} failed: {stderr_tail(self._stderr.text())}")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


LOAD_STDOUT_KEEP = 1 << 20
"""What nodekit keeps of ``docker load --quiet``'s output, which it reads for the images loaded: one short line per
image and tag, some 10,000 of them in 1 MiB (a load through SSH is whatever the node answers)."""


class LoadSink:
    """Feeds ``docker load`` on ``host``. ``finish`` ends the stream and returns what was loaded; ``abort`` cuts
    the request off so that the engine discards it. Failures raise ShipError carrying docker's own last line
    (``LoadSink.stderr`` keeps its last 64 KiB)."""

    def __init__(self, host: str | None = None, *, argv: list[str] | None = None) -> None:
        """``argv``: run this command instead of ``docker load`` on ``host`` (an ssh command that decompresses the
        stream on the node and loads it there, say); it must print what ``docker load --quiet`` prints."""
        self.host = host
        self.stderr = ""
        fix = f"check that engine (docker{' -H ' + host if host else ''} info; restart dockerd if it does not answer)"
        self._proc = proc.start(argv or docker_argv(host, "image", "load", "--quiet"), stdin="pipe", stdout="pipe",
                                stderr="pipe", deadline=proc.Stall(LOAD_STALL_S), what=f"docker load on {where(host)}",
                                fix=fix, group=True, stop_with=signal.SIGKILL)  # fmt: skip
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._stdout = Drain(self._proc.stdout, keep=LOAD_STDOUT_KEEP)
        self._stderr = Drain(self._proc.stderr)

    def write(self, chunk: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            with self._proc.waiting():
                stdin.write(chunk)
        except (BrokenPipeError, ValueError):
            self._proc.wait()
            self._proc.check()  # it took nothing for LOAD_STALL_S: that, not the broken pipe, is the news
            raise self._failure() from None

    def finish(self) -> Loaded:
        """The end of the stream, and the engine's answer. This waits for that answer: the caller bounds it (a
        target that took every byte and never answers: nodekit.ship.outcome.answered_within) by :meth:`abort`."""
        stdin = self._proc.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError):
            stdin.close()
        if self._proc.wait() != 0:
            raise self._failure()
        refs, ids = [], []
        for line in self._stdout.text().splitlines():
            if line.startswith("Loaded image ID: "):
                ids.append(line.removeprefix("Loaded image ID: ").strip())
            elif line.startswith("Loaded image: "):
                refs.append(line.removeprefix("Loaded image: ").strip())
        return Loaded(refs=tuple(refs), ids=tuple(ids))

    def abort(self) -> None:
        self._proc.cut_off()

    def _failure(self) -> ShipError:
        self.stderr = self._stderr.text()
        return ShipError(f"docker load on {where(self.host)} failed: {stderr_tail(self.stderr)}")


def buildx_export(
    context: Path,
    *,
    dockerfile: Path,
    target: str,
    build_contexts: Mapping[str, Path],
    build_args: Mapping[str, str],
    no_cache: bool = False,
    on_line: Callable[[str], None] = lambda _line: None,
    stop: threading.Event | None = None,
) -> Generator[bytes, None, None]:
    """Build the stage ``target`` and stream its file system as a tar (``--output type=tar,dest=-``): the bytes
    are yielded as they come, BuildKit's plain progress lines go to ``on_line`` (from this generator's thread, between
    chunks). RUN steps get no network (``--network=none``). BuildError, with BuildKit's error line, when the build
    fails. Closing the generator early stops the build, and so does ``stop`` once set (checked every 0.25 s, also
    while BuildKit installs and nothing streams yet)."""
    import queue

    argv = [*docker_argv(None, "buildx", "build"), "--file", str(dockerfile), "--target", target, "--network=none",
            "--provenance=false", "--progress=plain", "--output", "type=tar,dest=-"]  # fmt: skip
    for k, v in build_contexts.items():
        argv += ["--build-context", f"{k}={v}"]
    for name, value in build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    if no_cache:
        argv.append("--no-cache")
    argv.append(str(context))
    child = proc.start(argv, deadline=_BUILD, what=f"docker buildx build --target {target}", stdin="devnull",
                       stdout="pipe", stderr="pipe", group=True, stop_with=signal.SIGTERM)  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    tail: list[str] = []

    def pump(pipe: IO[bytes]) -> None:
        for raw in pipe:
            lines.put(raw.decode(errors="replace").rstrip("\n"))

    reader = threading.Thread(target=pump, args=(child.stderr,), daemon=True)
    reader.start()
    if stop is not None:

        def watch(flag: threading.Event) -> None:
            while child.poll() is None:
                if flag.wait(0.25):
                    child.end(proc.signals.GRACE_S)
                    return

        threading.Thread(target=watch, args=(stop,), daemon=True).start()

    def drain() -> None:
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                return
            tail[:] = [*tail[-39:], line]
            on_line(line)

    read = getattr(child.stdout, "read1", child.stdout.read)  # what has arrived, not a full chunk's wait
    try:
        while chunk := read(CHUNK):
            drain()
            yield chunk
        code = child.wait()
        reader.join(timeout=10)  # its pipe closed with the process: what is left is already in the queue
        drain()
    finally:
        if child.poll() is None:  # the consumer stopped reading (a signal, an error of its own): the build stops
            child.end(proc.signals.GRACE_S)
    if code != 0:
        errors = [ln for ln in tail if "ERROR" in ln or "error:" in ln.lower()]
        raise BuildError(
            f"image build failed: {errors[-1].strip() if errors else (tail[-1] if tail else f'exit code {code}')}",
            fix=f"see the build output above; rerun with docker buildx build -f {dockerfile} --target {target} ... "
            f"{context}",
        )


_BUILD = proc.Unbounded("a build: it lasts as long as its own steps; Ctrl-C stops it")
