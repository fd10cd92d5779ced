"""The only module that talks to Docker, Compose and Buildx, always through python-on-whales.

Functions take what they act on (an engine host, a compose file, a project name) and return plain models;
DockerException never leaves this module: it becomes an EngineError, ImageError or BuildError with a fix.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from nodekit import proc
from nodekit.errors import BuildError, DeadlineError, EngineError, ImageError, NodekitError, ShipError

if TYPE_CHECKING:
    from python_on_whales import DockerClient

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ENGINE_FIX = "make engine (provisions Docker Engine with Compose v2 and Buildx), or start your Docker daemon"

# Deadlines of engine calls (seconds). A healthy engine answers a query in well under a second, over SSH in a few;
# minutes mean it hung (a wedged dockerd, a dead SSH link). Calls that last as long as the job (log follow, wait)
# and the image build (its own steps' time) have none.
ENGINE_CALL_S = 120.0
CONTAINER_START_S = 600.0  # compose up / a throw-away container: create and start, the image already local
LOAD_S = 1800.0  # docker load of a whole image archive from a file
LASTS_AS_LONG_AS_THE_JOB = proc.Unbounded("it lasts as long as the job (log follow, wait) or its own steps (build)")


def _hung(host: str | None, what: str, deadline: float) -> DeadlineError:
    """The error for an engine call that its deadline stopped."""
    return proc.hung(f"{what} on {_where(host)}", deadline, _hung_fix(host), cause="the engine hung")


def _hung_fix(host: str | None) -> str:
    return f"check that engine: docker{' -H ' + host if host else ''} info; restart dockerd if it does not answer"


@dataclass(frozen=True)
class EngineInfo:
    host: str
    server_version: str
    compose_version: str
    buildx_version: str


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    size: int
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerState:
    name: str
    status: str
    running: bool
    exit_code: int | None
    image: str = ""
    started_at: str = ""
    finished_at: str = ""


Deadline = float | proc.Unbounded | Literal["query"] | None


def client(
    host: str | None = None,
    *,
    compose_file: Path | None = None,
    project: str | None = None,
    deadline: Deadline = "query",
) -> DockerClient:
    """A client for ``host`` (None: the default engine; else unix://, tcp:// or ssh:// endpoints) whose every call
    is stopped after ``deadline`` seconds ("query": :data:`ENGINE_CALL_S`; proc.Unbounded or None: none) and gets
    the runner's environment: both through :func:`nodekit.proc.command_prefix`."""
    from python_on_whales import DockerClient

    _require_cli()
    return DockerClient(
        host=host,
        compose_files=[compose_file] if compose_file else [],
        compose_project_name=project,
        client_call=[*proc.command_prefix(ENGINE_CALL_S if deadline == "query" else deadline), "docker"],
    )


def _require_cli() -> None:
    if shutil.which("docker") is None:
        raise EngineError("the docker command-line client is not installed", fix=ENGINE_FIX)


class Engine:
    """A python-on-whales client (``docker``) with its deadline, and the one way its calls fail: :meth:`calling`."""

    def __init__(
        self,
        host: str | None = None,
        *,
        deadline: Deadline = "query",
        compose_file: Path | None = None,
        project: str | None = None,
    ) -> None:
        self.host = host
        self.docker = client(host, compose_file=compose_file, project=project, deadline=deadline)
        seconds = ENGINE_CALL_S if deadline == "query" else deadline
        self.deadline = float(seconds) if isinstance(seconds, int | float) else None

    @contextlib.contextmanager
    def calling(
        self,
        what: str,
        error: Callable[[str], NodekitError],
        *,
        diagnose: bool = False,
        undo: Callable[[], object] | None = None,
    ) -> Iterator[None]:
        """Around python-on-whales calls: DockerException never leaves. ``undo`` runs first (its own failure
        ignored); then DeadlineError when the call's deadline stopped it, check_engine's precise EngineError when
        ``diagnose`` and the engine or Compose is what is missing, else ``error(Docker's last line)``."""
        from python_on_whales import DockerException

        try:
            yield
        except DockerException as e:
            if undo is not None:
                with contextlib.suppress(DockerException):
                    undo()
            if self.deadline is not None and proc.stopped(getattr(e, "return_code", None)):
                raise _hung(self.host, what, self.deadline) from None
            if diagnose:
                _diagnose(self.host)
            raise error(_last_line(e)) from None


def _where(host: str | None) -> str:
    return host or "the local Docker engine"


def check_engine(host: str | None = None, *, buildx: bool = True) -> EngineInfo:
    """Versions of the engine and of the Compose v2 and Buildx plugins; EngineError when any is missing. Running a
    job needs no Buildx: ``buildx=False`` skips that plugin (``buildx_version`` is then empty), the slowest of the
    three calls (0.15 s of about 0.3 s here), twice on the way from ``nodekit up`` to the container's start."""
    e = Engine(host)
    with e.calling("docker version", _no_engine(host)):
        server = e.docker.version().server
    if server is None:
        raise EngineError(f"no Docker engine answers at {_where(host)}", fix=ENGINE_FIX)
    with e.calling("docker compose version", _missing("Compose v2", "compose")):
        compose = e.docker.compose.version()
    buildx_version = ""
    if buildx:
        with e.calling("docker buildx version", _missing("Buildx", "buildx")):
            buildx_version = e.docker.buildx.version()
    return EngineInfo(
        host=_where(host), server_version=str(server.version), compose_version=compose, buildx_version=buildx_version
    )


def fails(kind: type[NodekitError], says: str, fix: str) -> Callable[[str], NodekitError]:
    """The error of a failed call: ``kind("<says>: <Docker's last line>", fix=fix)``."""
    return lambda why: kind(f"{says}: {why}", fix=fix)


def _missing(plugin: str, command: str) -> Callable[[str], NodekitError]:
    return lambda _: EngineError(f"Docker {plugin} (the `docker {command}` plugin) is missing", fix=ENGINE_FIX)


def _no_engine(host: str | None) -> Callable[[str], NodekitError]:
    return lambda why: EngineError(f"no Docker engine answers at {_where(host)} ({why})", fix=ENGINE_FIX)


def runtimes(host: str | None = None) -> tuple[str, ...]:
    """The container runtimes the engine at ``host`` offers (``nvidia`` where the NVIDIA toolkit is set up)."""
    e = Engine(host)
    with e.calling("docker info", _no_engine(host)):
        info = e.docker.system.info()
    return tuple(sorted((info.runtimes or {}).keys()))


def image_info(ref: str, host: str | None = None) -> ImageInfo | None:
    """The image ``ref`` on ``host``, or None when that engine does not have it."""
    from python_on_whales.exceptions import NoSuchImage

    e = Engine(host)
    cannot = f"cannot inspect image {ref} on {_where(host)}"
    with e.calling(f"inspecting image {ref}", fails(EngineError, cannot, ENGINE_FIX), diagnose=True):
        try:  # one call: asking exists() first would inspect the image twice
            img = e.docker.image.inspect(ref)
        except NoSuchImage:
            return None
    config = img.config
    env = dict(item.split("=", 1) for item in (config.env or []) if "=" in item) if config else {}
    return ImageInfo(
        id=str(img.id),
        tags=tuple(img.repo_tags or ()),
        labels=dict((config.labels or {}) if config else {}),
        size=int(img.size or 0),
        env=env,
    )


def require_image(ref: str, host: str | None = None, *, node: str | None = None) -> ImageInfo:
    info = image_info(ref, host)
    if info is None:
        raise ImageError(
            f"image {ref} is not on {_where(host)}",
            fix="nodekit build (on this node), or nodekit push from the node that built it",
            node=node,
        )
    return info


def images_labelled(label: str, value: str, host: str | None = None) -> list[ImageInfo]:
    """Images carrying ``label=value``, newest first. Two engine calls whatever their number (python-on-whales'
    list inspects each image separately: 60 calls and 1.5 s for 20 images, on the path of every ``nodekit up``)."""
    import json

    out = _inspect_listed(host, ("--filter", f"label={label}={value}"), (), what="list images")
    found = json.loads(out) if out else []
    found.sort(key=lambda i: str(i.get("Created", "")), reverse=True)
    return [_image_info_of(i) for i in found]


def _image_info_of(inspected: Mapping[str, object]) -> ImageInfo:
    """An ImageInfo from one entry of ``docker image inspect``'s JSON."""
    config = inspected.get("Config")
    config = config if isinstance(config, dict) else {}
    env = [e for e in (config.get("Env") or []) if isinstance(e, str) and "=" in e]
    return ImageInfo(
        id=str(inspected.get("Id", "")),
        tags=tuple(str(t) for t in (inspected.get("RepoTags") or [])),  # type: ignore[attr-defined]
        labels={str(k): str(v) for k, v in (config.get("Labels") or {}).items()},
        size=int(inspected.get("Size") or 0),  # type: ignore[call-overload]
        env=dict(e.split("=", 1) for e in env),
    )


# --- compose ---------------------------------------------------------------------------------------------


def compose_config(compose_file: Path) -> dict[str, object]:
    """`docker compose config` of a file, as JSON: proves Compose accepts it."""
    e = Engine(compose_file=compose_file)
    rejects = f"docker compose rejects {compose_file}"
    with e.calling(f"docker compose config of {compose_file}", fails(ImageError, rejects, "nodekit compose")):
        out = e.docker.compose.config(return_json=True)
    assert isinstance(out, dict)
    return out


def compose_up(compose_file: Path, project: str, *, host: str | None = None) -> None:
    """Create and start the node's container in the background (recreated if it exists) on ``host``'s engine."""
    e = Engine(host, compose_file=compose_file, project=project, deadline=CONTAINER_START_S)
    failed = f"docker compose up failed for {compose_file}"
    fix = f"docker compose -f {compose_file} up  (to see Docker's full output)"
    # Nothing half-running: a container that was created but failed to start is removed again.
    with e.calling(f"docker compose up of {compose_file}", fails(EngineError, failed, fix),
                   diagnose=True, undo=lambda: e.docker.compose.down(remove_orphans=True, quiet=True)):  # fmt: skip
        e.docker.compose.up(detach=True, force_recreate=True, quiet=True)


def compose_logs(
    compose_file: Path | None, project: str, *, follow: bool, tail: str | None = None, host: str | None = None
) -> Iterator[str]:
    """The job's output line by line; with ``follow`` it ends when the container stops."""
    e = Engine(host, compose_file=compose_file, project=project, deadline=LASTS_AS_LONG_AS_THE_JOB)
    fix = f"docker compose -p {project} ps  (is it running?)"
    with e.calling("docker compose logs", fails(EngineError, f"lost the log stream of {project}", fix)):
        for _source, content in e.docker.compose.logs(follow=follow, stream=True, no_log_prefix=True, tail=tail):
            # Compose writes terminal control sequences (erase-line) even with --no-color; they garble prefixed logs.
            yield _ANSI.sub("", content.decode(errors="replace")).rstrip("\n")


def compose_ps(compose_file: Path | None, project: str, *, host: str | None = None) -> list[ContainerState]:
    e = Engine(host, compose_file=compose_file, project=project)
    cannot = f"cannot list the containers of {project}"
    with e.calling(f"docker compose ps of {project}", fails(EngineError, cannot, ENGINE_FIX)):
        containers = e.docker.compose.ps(all=True)
    states = []
    for c in containers:
        st = c.state
        states.append(
            ContainerState(
                name=str(c.name),
                status=str(st.status),
                running=bool(st.running),
                exit_code=None if st.running else st.exit_code,
                image=str(c.config.image or "") if c.config else "",
                started_at=str(st.started_at or ""),
                finished_at=str(st.finished_at or ""),
            )
        )
    return states


def compose_wait(compose_file: Path | None, project: str, *, host: str | None = None) -> int:
    """Block until the node's container exits; its exit code. EngineError when the engine cannot be asked."""
    e = Engine(host, compose_file=compose_file, project=project, deadline=LASTS_AS_LONG_AS_THE_JOB)
    lost = f"lost {_where(host)} while waiting for {project}"
    with e.calling("docker wait", fails(EngineError, lost, ENGINE_FIX)):
        return _wait(e.docker, project)


def _wait(d: DockerClient, project: str) -> int:
    containers = d.compose.ps(all=True)
    if not containers:
        raise EngineError(f"compose project {project} has no container", fix="nodekit up")
    code = d.container.wait(containers[0])
    return int(code) if not isinstance(code, list) else int(code[0])


def compose_stop(compose_file: Path | None, project: str, *, timeout: int | None = None) -> None:
    e = Engine(compose_file=compose_file, project=project, deadline=_stop_deadline(timeout))
    fix = f"docker compose -p {project} stop"
    with e.calling(f"docker compose stop of {project}", fails(EngineError, "docker compose stop failed", fix)):
        e.docker.compose.stop(timeout=timeout)


def compose_down(
    compose_file: Path | None, project: str, *, timeout: int | None = None, host: str | None = None
) -> None:
    e = Engine(host, compose_file=compose_file, project=project, deadline=_stop_deadline(timeout))
    fix = f"docker compose -p {project} down"
    with e.calling(f"docker compose down of {project}", fails(EngineError, "docker compose down failed", fix)):
        e.docker.compose.down(timeout=timeout, remove_orphans=True, quiet=True)


def _stop_deadline(timeout: int | None) -> float:
    """Stopping waits up to ``timeout`` (Docker's default 10 s) per container before killing it, then removes."""
    return (10 if timeout is None else timeout) + ENGINE_CALL_S


def _diagnose(host: str | None) -> None:
    """After a call failed: raise check_engine's precise EngineError when the engine or the Compose plugin is what
    is missing (the docker CLI's own words for that vary: "unknown flag: --file" when Compose is absent). The
    calls on every ``nodekit up`` no longer check first (0.7 s here); only a failure pays for the diagnosis."""
    check_engine(host, buildx=False)


def _last_line(e: Exception) -> str:
    stderr = getattr(e, "stderr", None) or str(e)
    lines = [ln.strip() for ln in str(stderr).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


__all__ = ["BuildError", "ContainerState", "EngineInfo", "ImageInfo"]


# --- shipping: save, load, push ---------------------------------------------------------------------------
# python-on-whales builds the command line here (host, context, TLS and config flags, as for every other call),
# but the byte streams run through our own processes: its load-from-iterator lets docker's stderr go to the
# terminal (a failed load could not say why) and cannot be cut off halfway, and cutting a load off is how a broken
# stream is kept from ever completing on a target. A `docker load` whose request body ends early registers
# nothing, so a target's existing images stay as they were.

CHUNK = 1 << 20


@dataclass(frozen=True)
class EngineFacts:
    """What shipping needs to know about one engine."""

    engine_id: str
    server_version: str
    root_dir: str
    free_bytes: int | None
    """Free space under the engine's data root; None when the engine is not on this machine."""
    containerd_store: bool = False
    """Images are kept in containerd's store (snapshotters), not the classic graphdriver layer store."""


def engine_facts(host: str | None) -> EngineFacts:
    """Identity, version and free disk of the engine at ``host``; EngineError when it does not answer."""
    import os

    e = Engine(host)
    with e.calling("docker info", _no_engine(host)):
        info = e.docker.system.info()
    root = str(info.docker_root_dir or "")
    free = None
    # Only a unix socket proves the engine is on this machine, so that its data root is our path too (a context
    # may point anywhere: then we do not know).
    endpoint = host or os.environ.get("DOCKER_HOST") or ("" if os.environ.get("DOCKER_CONTEXT") else "unix://")
    if endpoint.startswith("unix://"):
        try:
            st = os.statvfs(root)
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
    containerd = any("containerd.snapshotter" in str(v) for _, v in (info.driver_status or []))
    return EngineFacts(
        engine_id=str(info.id or ""),
        server_version=str(info.server_version or ""),
        root_dir=root,
        free_bytes=free,
        containerd_store=containerd,
    )


def tag_image(image: str, ref: str, host: str | None = None) -> None:
    e = Engine(host)
    cannot = f"cannot tag {image} as {ref} on {_where(host)}"
    with e.calling(f"tagging {image}", fails(ImageError, cannot, ENGINE_FIX)):
        e.docker.image.tag(image, ref)


def _docker_argv(host: str | None, *args: str) -> list[str]:
    """A docker command line for the runner (which applies its own deadline and environment), built by
    python-on-whales as for every other call (host, context, TLS and config flags)."""
    from python_on_whales import DockerClient

    _require_cli()
    return [str(a) for a in DockerClient(host=host).client_config.docker_cmd] + list(args)


class _Drain:
    """Collects a pipe in a thread, so a chatty process never blocks on a full pipe while we feed it."""

    def __init__(self, pipe: IO[bytes]) -> None:
        import threading

        self.data = b""
        self._pipe = pipe
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.data = self._pipe.read()

    def text(self, timeout: float = 10.0) -> str:
        self._thread.join(timeout)
        return self.data.decode(errors="replace")


class SaveStream:
    """The bytes of ``docker save REF`` on ``host``, in chunks. Iterating to the end raises ShipError when
    docker save fails (its last stderr line says why); ``close`` stops it early."""

    def __init__(self, ref: str, host: str | None = None) -> None:
        self.ref = ref
        self.host = host
        self._proc = proc.start(_docker_argv(host, "image", "save", ref), stdout="pipe", stderr="pipe",
                                deadline=_STREAM, what=f"docker save {ref}")  # fmt: skip
        assert self._proc.stderr is not None
        self._stderr = _Drain(self._proc.stderr)

    def __iter__(self) -> Iterator[bytes]:
        out = self._proc.stdout
        assert out is not None
        while chunk := out.read(CHUNK):
            yield chunk
        code = self._proc.wait()
        if code != 0:
            raise ShipError(f"docker save {self.ref} on {_where(self.host)} failed: {_tail(self._stderr.text())}")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


_STREAM = proc.Unbounded("a stream: whoever reads or feeds it closes or cuts it off")


@dataclass(frozen=True)
class Loaded:
    """What one ``docker load`` reported: the references (``name:tag``) and the untagged image ids it loaded."""

    refs: tuple[str, ...]
    ids: tuple[str, ...]


class LoadSink:
    """Feeds ``docker load`` on ``host``. ``finish`` ends the stream and returns what was loaded; ``abort`` cuts
    the request off so that the engine discards it. Failures raise ShipError carrying docker's own last line
    (``LoadSink.stderr`` keeps all of it)."""

    def __init__(self, host: str | None = None) -> None:
        self.host = host
        self.stderr = ""
        self._proc = proc.start(_docker_argv(host, "image", "load", "--quiet"), stdin="pipe", stdout="pipe",
                                stderr="pipe", deadline=_STREAM, what="docker load")  # fmt: skip
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._stdout = _Drain(self._proc.stdout)
        self._stderr = _Drain(self._proc.stderr)

    def write(self, chunk: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(chunk)
        except (BrokenPipeError, ValueError):
            self._proc.wait()
            raise self._failure() from None

    def finish(self) -> Loaded:
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
        return ShipError(f"docker load on {_where(self.host)} failed: {_tail(self.stderr)}")


def _tail(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


# --- images: build, import, save, load ---
# Builds run through `docker buildx build` with the engine's own `docker` driver, so the result lands in the
# engine's image store directly (no --load copy) and BuildKit resolves FROM against local images first.


def buildx_build(
    context: Path,
    *,
    dockerfile: Path,
    tag: str,
    build_contexts: Mapping[str, Path],
    build_args: Mapping[str, str],
    metadata_file: Path,
    no_cache: bool = False,
    target: str | None = None,
) -> Iterator[str]:
    """Run the build, yielding BuildKit's plain progress output line by line.

    RUN steps get no network at all (``--network=none``): a build that tries to download fails instead of
    silently depending on an index. Raises BuildError, with BuildKit's error line, when the build fails.
    """
    e = Engine(deadline=LASTS_AS_LONG_AS_THE_JOB)
    logs = e.docker.buildx.build(
        context,
        file=dockerfile,
        tags=[tag],
        build_contexts={k: str(v) for k, v in build_contexts.items()},
        build_args=dict(build_args),
        metadata_file=metadata_file,
        target=target,
        cache=not no_cache,
        network="none",
        provenance=False,
        progress="plain",
        load=True,
        stream_logs=True,
    )
    assert isinstance(logs, Iterator)
    tail: list[str] = []

    def failed(last: str) -> BuildError:
        errors = [ln for ln in tail if "ERROR" in ln or "error:" in ln.lower()]
        return BuildError(
            f"image build failed: {errors[-1].strip() if errors else last}",
            fix=f"see the build output above; rerun with docker buildx build -f {dockerfile} ... {context}",
        )

    with e.calling("docker buildx build", failed):
        for chunk in logs:
            for line in chunk.splitlines():
                tail = [*tail[-39:], line]
                yield line


def image_layers(ref: str, host: str | None = None) -> tuple[str, ...]:
    """The image's layer digests (its rootfs diff ids), base first."""
    e = Engine(host)
    cannot = f"cannot inspect image {ref} on {_where(host)}"
    with e.calling(f"inspecting image {ref}", fails(ImageError, cannot, "nodekit build")):
        img = e.docker.image.inspect(ref)
    return tuple(str(layer) for layer in (img.root_fs.layers or []))


def run_in_image(ref: str, command: list[str], *, entrypoint: str | None = None, host: str | None = None) -> str:
    """Run ``command`` in a throw-away container of ``ref`` with no network; its standard output."""
    import uuid

    name = f"nodekit-probe-{uuid.uuid4().hex[:12]}"
    e = Engine(host, deadline=CONTAINER_START_S)
    failed, fix = f"running {command[0]} in {ref} failed", f"docker run --rm {ref}"
    # A container its deadline stopped the client of is still running: removed, not left behind.
    with e.calling(f"running {command[0]} in {ref}", fails(ImageError, failed, fix),
                   undo=lambda: client(host).container.remove(name, force=True)):  # fmt: skip
        out = e.docker.container.run(ref, command, entrypoint=entrypoint, remove=True, networks=["none"], name=name)
    return str(out)


def probe_image(ref: str, script: str, *, env: Mapping[str, str], timeout: float, host: str | None = None) -> str:
    """``sh -c script`` in a throw-away container of ``ref``: no network, the image's own user and PATH, ``env``
    added; its standard output. ImageError with Docker's reason when it cannot start (an image without ``sh``),
    fails, or outlives ``timeout`` seconds (the container is then removed)."""
    import uuid

    name = f"nodekit-probe-{uuid.uuid4().hex[:12]}"
    argv = _docker_argv(
        host, "run", "--rm", "--name", name, "--network", "none", "--pull", "never",
        *(a for k in sorted(env) for a in ("--env", k)), "--entrypoint", "sh", ref, "-c", script,
    )  # fmt: skip
    fix = f"docker run --rm --network none --entrypoint sh {ref} -c 'python3 -V'"
    try:
        done = proc.run(argv, deadline=timeout, what=f"probing {ref}", fix=fix, env=proc.environ(env))
    except DeadlineError:
        with contextlib.suppress(DeadlineError):  # the engine hung: the error below says so
            proc.run(_docker_argv(host, "rm", "-f", name), deadline=ENGINE_CALL_S, what="docker rm", fix="")
        raise ImageError(f"probing {ref} did not finish within {timeout:.0f} s", fix=fix) from None
    if done.returncode != 0:
        why = _docker_run_error(done.stderr)
        if "executable file not found" in why or "no such file or directory" in why:
            raise ImageError(f"image {ref} has no /bin/sh (so no Python nodekit can use)", fix=fix)
        raise ImageError(f"probing {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return done.stdout


def _docker_run_error(stderr: str) -> str:
    """docker run ends its stderr with "Run 'docker run --help' ..."; the reason is the "docker: Error ..." line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith("docker:") or "Error" in ln), _tail(stderr))


def run_as_job(
    ref: str,
    script: str,
    *,
    ulimits: list[str] | None = None,
    gpus: bool = False,
    timeout: float,
    host: str | None = None,
) -> str:
    """``sh -c script`` in a throw-away container of ``ref`` set up as a node's job is (host network and IPC,
    ``ulimits`` such as ``stack=67108864:67108864``, every GPU when ``gpus``); its standard output.

    For ``nodekit doctor``: the limits, shared memory and GPUs a job will see. EngineError, with Docker's own
    error line, when the container cannot start (runc refusing a limit, no NVIDIA runtime), the script fails,
    or it takes longer than ``timeout`` seconds. python-on-whales builds the command line; the process is ours
    so that stderr is captured (its ``run`` lets it through to the terminal) and the wait is bounded.
    """
    import secrets

    name = f"nodekit-probe-{secrets.token_hex(4)}"
    argv = _docker_argv(
        host,
        "run", "--rm", "--name", name, "--network", "host", "--ipc", "host",
        *(f"--ulimit={u}" for u in ulimits or []),
        *(["--gpus", "all"] if gpus else []),
        "--entrypoint", "sh", ref, "-c", script,
    )  # fmt: skip
    fix = f"docker run --rm --network host --ipc host{' --gpus all' if gpus else ''} --entrypoint true {ref}"
    try:
        done = proc.run(argv, deadline=timeout, what=f"a test container of {ref}", fix=fix)
    except DeadlineError:
        # Killing the client leaves the container running: remove it, or it would hold the ports and GPUs.
        with contextlib.suppress(OSError, DeadlineError):
            proc.run(_docker_argv(host, "rm", "-f", name), deadline=30, what="docker rm", fix="")
        raise EngineError(
            f"a test container of {ref} did not finish within {timeout} s (it hung); it was removed", fix=fix
        ) from None
    if done.returncode != 0:
        why = _docker_run_error(done.stderr)
        raise EngineError(f"a test container of {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return done.stdout


def remove_image(ref: str, host: str | None = None) -> None:
    """Remove the tag ``ref`` (layers other images share stay); a missing image is not an error."""
    e = Engine(host)
    cannot = f"cannot remove {ref} on {_where(host)}"
    with e.calling(f"removing {ref}", fails(ImageError, cannot, f"docker rmi {ref}")):
        if e.docker.image.exists(ref):
            e.docker.image.remove(ref, prune=False)


def load_archive(archive: Path) -> None:
    """``docker load`` an image archive from a file (the base image nodekit writes itself)."""
    e = Engine(deadline=LOAD_S)
    failed = f"docker load of {archive} failed"
    with e.calling(f"docker load of {archive}", fails(ImageError, failed, "nodekit base")):
        e.docker.image.load(archive, quiet=True)


def layer_lists(host: str | None = None) -> list[tuple[str, ...]]:
    """The diff ids (base first) of every image on ``host``'s engine, dangling ones included: what its layer
    store holds, for planning which layers a push must send. Two calls, whatever the number of images."""
    import json

    out = _inspect_listed(host, ("--all",), ("--format", "{{json .RootFS.Layers}}"), what="list the images")
    return [tuple(json.loads(line) or ()) for line in out.splitlines() if line.strip()]


def history_sizes(ref: str, host: str | None = None) -> tuple[int, ...]:
    """The size in bytes of every history entry of ``ref``, oldest first (0 for entries that made no layer)."""
    return tuple(size for _, _, size in image_history(ref, host))


def image_config(ref: str, host: str | None = None) -> dict[str, Any]:
    """What ``docker image inspect`` says of ``ref``: the runtime configuration (``Config``), ``Architecture``,
    ``Os``, ``Variant`` and ``RootFS`` as Docker spells them; the facts an image built on top of it starts from."""
    import json

    out = _query(host, "image", "inspect", "--format", "{{json .}}", ref, what=f"inspect {ref}", error=ImageError,
                 fix="nodekit build")  # fmt: skip
    found: dict[str, Any] = json.loads(out)
    return found


def image_history(ref: str, host: str | None = None) -> tuple[tuple[str, str, int], ...]:
    """``(created by, comment, size in bytes)`` of every history entry of ``ref``, oldest first."""
    import json

    out = _query(
        host, "image", "history", "--human=false", "--no-trunc", "--format", "{{json .}}", ref,
        what=f"read the history of {ref}", error=ImageError, fix="nodekit build",
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return tuple(
        (str(r.get("CreatedBy", "")), str(r.get("Comment", "")), int(r["Size"]) if str(r.get("Size", "")).isdigit()
         else 0)
        for r in reversed(rows)
    )  # fmt: skip


def _query(
    host: str | None, *args: str, what: str, error: type[NodekitError] = EngineError, fix: str = ENGINE_FIX
) -> str:
    """One docker query run as our own process (the command line built by python-on-whales), under the query
    deadline; its standard output. ``error`` when it fails ("cannot ``what``"), DeadlineError when it hangs."""
    call = " ".join(("docker", *args[:2]))  # e.g. docker image ls
    done = proc.run(_docker_argv(host, *args), deadline=ENGINE_CALL_S, what=f"{call} on {_where(host)}",
                    fix=_hung_fix(host), cause="the engine hung")  # fmt: skip
    if done.returncode != 0:
        raise error(f"cannot {what} on {_where(host)}: {_tail(done.stderr)}", fix=fix)
    return done.stdout


def _inspect_listed(host: str | None, ls: tuple[str, ...], inspect: tuple[str, ...], *, what: str) -> str:
    """``docker image inspect [inspect...]`` of every image ``docker image ls [ls...]`` lists: two calls, whatever
    their number; "" when there is none. An image removed between the two calls makes inspect fail: ask again
    once, then give up."""

    def ids() -> list[str]:
        return sorted(set(_query(host, "image", "ls", *ls, "--quiet", "--no-trunc", what=what).split()))

    listed = ids()
    if not listed:
        return ""
    try:
        return _query(host, "image", "inspect", *inspect, *listed, what=what)
    except EngineError:
        listed = ids()
        return _query(host, "image", "inspect", *inspect, *listed, what=what) if listed else ""
