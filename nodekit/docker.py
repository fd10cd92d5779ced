"""The only module that talks to Docker, Compose and Buildx, always through python-on-whales.

Functions take what they act on (an engine host, a compose file, a project name) and return plain models;
DockerException never leaves this module: it becomes an EngineError, ImageError or BuildError with a fix.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from nodekit.errors import BuildError, DeadlineError, EngineError, ImageError, NodekitError, ShipError

if TYPE_CHECKING:
    import subprocess

    from python_on_whales import DockerClient

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ENGINE_FIX = "make engine (provisions Docker Engine with Compose v2 and Buildx), or start your Docker daemon"

# Deadlines of engine calls (seconds). A healthy engine answers a query in well under a second, over SSH in a few;
# minutes mean it hung (a wedged dockerd, a dead SSH link). Calls that last as long as the job (log follow, wait)
# and the image build (its own steps' time) have none.
ENGINE_CALL_S = 120.0
CONTAINER_START_S = 600.0  # compose up / a throw-away container: create and start, the image already local
LOAD_S = 1800.0  # docker load of a whole image archive from a file
_HUNG = (124, 137)  # timeout(1)'s code when the deadline passed; 128+9 when it had to kill


def _timeout_call(deadline: float | None) -> list[str]:
    """The command python-on-whales runs: ``docker``, behind GNU timeout(1) when there is a deadline.

    ``--foreground`` keeps docker in our process group, so Ctrl-C reaches it as before; ``--kill-after`` ends a
    docker that ignores the TERM. Without GNU timeout on PATH (not Linux), calls run without a deadline.
    """
    if deadline is None or not _gnu_timeout():
        return ["docker"]
    return ["timeout", "--foreground", "--kill-after=5", f"{deadline:g}", "docker"]


@functools.cache
def _gnu_timeout() -> bool:
    import subprocess

    if shutil.which("timeout") is None:
        return False
    try:
        out = subprocess.run(["timeout", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GNU coreutils" in out


def _hung(host: str | None, what: str, deadline: float) -> DeadlineError:
    """The error for an engine call that its deadline stopped."""
    return DeadlineError(
        f"{what} on {_where(host)} did not finish within {deadline:g} s and was stopped (the engine hung)",
        fix=f"check that engine: docker{' -H ' + host if host else ''} info; restart dockerd if it does not answer",
    )


def _raise_if_hung(e: Exception, host: str | None, what: str, deadline: float) -> None:
    """DeadlineError when ``e`` is a python-on-whales call that its deadline (timeout(1)) stopped."""
    if getattr(e, "return_code", None) in _HUNG and _gnu_timeout():
        raise _hung(host, what, deadline) from None


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


def client(
    host: str | None = None,
    *,
    compose_file: Path | None = None,
    project: str | None = None,
    deadline: float | Literal["query"] | None = "query",
) -> DockerClient:
    """A client for ``host`` (None: the default engine; else unix://, tcp:// or ssh:// endpoints) whose every call
    is stopped after ``deadline`` seconds (None: no deadline; "query": :data:`ENGINE_CALL_S`); see
    :func:`_raise_if_hung`."""
    from python_on_whales import DockerClient

    if deadline == "query":
        deadline = ENGINE_CALL_S

    if shutil.which("docker") is None:
        raise EngineError("the docker command-line client is not installed", fix=ENGINE_FIX)
    return DockerClient(
        host=host,
        compose_files=[compose_file] if compose_file else [],
        compose_project_name=project,
        client_call=_timeout_call(deadline),
    )


def _where(host: str | None) -> str:
    return host or "the local Docker engine"


def check_engine(host: str | None = None, *, buildx: bool = True) -> EngineInfo:
    """Versions of the engine and of the Compose v2 and Buildx plugins; EngineError when any is missing. Running a
    job needs no Buildx: ``buildx=False`` skips that plugin (``buildx_version`` is then empty), the slowest of the
    three calls (0.15 s of about 0.3 s here), twice on the way from ``nodekit up`` to the container's start."""
    from python_on_whales import DockerException

    d = client(host)
    try:
        server = d.version().server
    except DockerException as e:
        _raise_if_hung(e, host, "docker version", ENGINE_CALL_S)
        raise EngineError(f"no Docker engine answers at {_where(host)} ({_last_line(e)})", fix=ENGINE_FIX) from None
    if server is None:
        raise EngineError(f"no Docker engine answers at {_where(host)}", fix=ENGINE_FIX)
    try:
        compose = d.compose.version()
    except DockerException as e:
        _raise_if_hung(e, host, "docker compose version", ENGINE_CALL_S)
        raise EngineError("Docker Compose v2 (the `docker compose` plugin) is missing", fix=ENGINE_FIX) from None
    buildx_version = ""
    if buildx:
        try:
            buildx_version = d.buildx.version()
        except DockerException as e:
            _raise_if_hung(e, host, "docker buildx version", ENGINE_CALL_S)
            raise EngineError("Docker Buildx (the `docker buildx` plugin) is missing", fix=ENGINE_FIX) from None
    return EngineInfo(
        host=_where(host), server_version=str(server.version), compose_version=compose, buildx_version=buildx_version
    )


def runtimes(host: str | None = None) -> tuple[str, ...]:
    """The container runtimes the engine at ``host`` offers (``nvidia`` where the NVIDIA toolkit is set up)."""
    from python_on_whales import DockerException

    try:
        info = client(host).system.info()
    except DockerException as e:
        _raise_if_hung(e, host, "docker info", ENGINE_CALL_S)
        raise EngineError(f"no Docker engine answers at {_where(host)} ({_last_line(e)})", fix=ENGINE_FIX) from None
    return tuple(sorted((info.runtimes or {}).keys()))


def image_info(ref: str, host: str | None = None) -> ImageInfo | None:
    """The image ``ref`` on ``host``, or None when that engine does not have it."""
    from python_on_whales import DockerException
    from python_on_whales.exceptions import NoSuchImage

    try:  # one call: asking exists() first would inspect the image twice
        img = client(host).image.inspect(ref)
    except NoSuchImage:
        return None
    except DockerException as e:
        _raise_if_hung(e, host, f"inspecting image {ref}", ENGINE_CALL_S)
        _diagnose(host)
        raise EngineError(f"cannot inspect image {ref} on {_where(host)}: {_last_line(e)}", fix=ENGINE_FIX) from None
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
    from python_on_whales import DockerException

    try:
        out = client(compose_file=compose_file).compose.config(return_json=True)
    except DockerException as e:
        _raise_if_hung(e, None, f"docker compose config of {compose_file}", ENGINE_CALL_S)
        raise ImageError(f"docker compose rejects {compose_file}: {_last_line(e)}", fix="nodekit compose") from None
    assert isinstance(out, dict)
    return out


def compose_up(compose_file: Path, project: str, *, host: str | None = None) -> None:
    """Create and start the node's container in the background (recreated if it exists) on ``host``'s engine."""
    from python_on_whales import DockerException

    d = client(host, compose_file=compose_file, project=project, deadline=CONTAINER_START_S)
    try:
        d.compose.up(detach=True, force_recreate=True, quiet=True)
    except DockerException as e:
        # Nothing half-running: a container that was created but failed to start is removed again.
        with contextlib.suppress(DockerException):
            d.compose.down(remove_orphans=True, quiet=True)
        _raise_if_hung(e, host, f"docker compose up of {compose_file}", CONTAINER_START_S)
        _diagnose(host)
        raise EngineError(
            f"docker compose up failed for {compose_file}: {_last_line(e)}",
            fix=f"docker compose -f {compose_file} up  (to see Docker's full output)",
        ) from None


def compose_logs(
    compose_file: Path | None, project: str, *, follow: bool, tail: str | None = None, host: str | None = None
) -> Iterator[str]:
    """The job's output line by line; with ``follow`` it ends when the container stops."""
    from python_on_whales import DockerException

    d = client(host, compose_file=compose_file, project=project, deadline=None)
    try:
        for _source, content in d.compose.logs(follow=follow, stream=True, no_log_prefix=True, tail=tail):
            # Compose writes terminal control sequences (erase-line) even with --no-color; they garble prefixed logs.
            yield _ANSI.sub("", content.decode(errors="replace")).rstrip("\n")
    except DockerException as e:
        raise EngineError(
            f"lost the log stream of {project}: {_last_line(e)}",
            fix=f"docker compose -p {project} ps  (is it running?)",
        ) from None


def compose_ps(compose_file: Path | None, project: str, *, host: str | None = None) -> list[ContainerState]:
    from python_on_whales import DockerException

    try:
        containers = client(host, compose_file=compose_file, project=project).compose.ps(all=True)
    except DockerException as e:
        _raise_if_hung(e, host, f"docker compose ps of {project}", ENGINE_CALL_S)
        raise EngineError(f"cannot list the containers of {project}: {_last_line(e)}", fix=ENGINE_FIX) from None
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
    from python_on_whales import DockerException

    d = client(host, compose_file=compose_file, project=project, deadline=None)
    try:
        return _wait(d, project)
    except DockerException as e:
        raise EngineError(f"lost {_where(host)} while waiting for {project}: {_last_line(e)}", fix=ENGINE_FIX) from None


def _wait(d: DockerClient, project: str) -> int:
    containers = d.compose.ps(all=True)
    if not containers:
        raise EngineError(f"compose project {project} has no container", fix="nodekit up")
    code = d.container.wait(containers[0])
    return int(code) if not isinstance(code, list) else int(code[0])


def compose_stop(compose_file: Path | None, project: str, *, timeout: int | None = None) -> None:
    from python_on_whales import DockerException

    try:
        client(compose_file=compose_file, project=project, deadline=_stop_deadline(timeout)).compose.stop(
            timeout=timeout
        )
    except DockerException as e:
        _raise_if_hung(e, None, f"docker compose stop of {project}", _stop_deadline(timeout))
        raise EngineError(
            f"docker compose stop failed: {_last_line(e)}", fix=f"docker compose -p {project} stop"
        ) from None


def compose_down(
    compose_file: Path | None, project: str, *, timeout: int | None = None, host: str | None = None
) -> None:
    from python_on_whales import DockerException

    try:
        client(host, compose_file=compose_file, project=project, deadline=_stop_deadline(timeout)).compose.down(
            timeout=timeout, remove_orphans=True, quiet=True
        )
    except DockerException as e:
        _raise_if_hung(e, host, f"docker compose down of {project}", _stop_deadline(timeout))
        raise EngineError(
            f"docker compose down failed: {_last_line(e)}", fix=f"docker compose -p {project} down"
        ) from None


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

    from python_on_whales import DockerException

    try:
        info = client(host).system.info()
    except DockerException as e:
        _raise_if_hung(e, host, "docker info", ENGINE_CALL_S)
        raise EngineError(f"no Docker engine answers at {_where(host)} ({_last_line(e)})", fix=ENGINE_FIX) from None
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
    from python_on_whales import DockerException

    try:
        client(host).image.tag(image, ref)
    except DockerException as e:
        _raise_if_hung(e, host, f"tagging {image}", ENGINE_CALL_S)
        raise ImageError(f"cannot tag {image} as {ref} on {_where(host)}: {_last_line(e)}", fix=ENGINE_FIX) from None


def _docker_argv(host: str | None, *args: str) -> list[str]:
    return [str(a) for a in client(host, deadline=None).client_config.docker_cmd] + list(args)


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
        import subprocess

        self.ref = ref
        self.host = host
        self._proc = subprocess.Popen(
            _docker_argv(host, "image", "save", ref), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
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


@dataclass(frozen=True)
class Loaded:
    """What one ``docker load`` reported: the references (``name:tag``) and the untagged image ids it loaded."""

    refs: tuple[str, ...]
    ids: tuple[str, ...]


def cut_off(proc: subprocess.Popen[bytes]) -> None:
    """End a process this one feeds on stdin: killed if it still runs, reaped, its stdin closed."""
    import contextlib

    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()


class LoadSink:
    """Feeds ``docker load`` on ``host``. ``finish`` ends the stream and returns what was loaded; ``abort`` cuts
    the request off so that the engine discards it. Failures raise ShipError carrying docker's own last line
    (``LoadSink.stderr`` keeps all of it)."""

    def __init__(self, host: str | None = None) -> None:
        import subprocess

        self.host = host
        self.stderr = ""
        self._proc = subprocess.Popen(
            _docker_argv(host, "image", "load", "--quiet"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
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
        import contextlib

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
        cut_off(self._proc)

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
    from python_on_whales import DockerException

    logs = client(deadline=None).buildx.build(
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
    try:
        for chunk in logs:
            for line in chunk.splitlines():
                tail = [*tail[-39:], line]
                yield line
    except DockerException as e:
        errors = [ln for ln in tail if "ERROR" in ln or "error:" in ln.lower()]
        why = errors[-1].strip() if errors else _last_line(e)
        raise BuildError(
            f"image build failed: {why}",
            fix=f"see the build output above; rerun with docker buildx build -f {dockerfile} ... {context}",
        ) from None


def image_layers(ref: str, host: str | None = None) -> tuple[str, ...]:
    """The image's layer digests (its rootfs diff ids), base first."""
    from python_on_whales import DockerException

    try:
        img = client(host).image.inspect(ref)
    except DockerException as e:
        _raise_if_hung(e, host, f"inspecting image {ref}", ENGINE_CALL_S)
        raise ImageError(
            f"cannot inspect image {ref} on {_where(host)}: {_last_line(e)}", fix="nodekit build"
        ) from None
    return tuple(str(layer) for layer in (img.root_fs.layers or []))


def run_in_image(ref: str, command: list[str], *, entrypoint: str | None = None, host: str | None = None) -> str:
    """Run ``command`` in a throw-away container of ``ref`` with no network; its standard output."""
    import uuid

    from python_on_whales import DockerException

    name = f"nodekit-probe-{uuid.uuid4().hex[:12]}"
    try:
        out = client(host, deadline=CONTAINER_START_S).container.run(
            ref, command, entrypoint=entrypoint, remove=True, networks=["none"], name=name
        )
    except DockerException as e:
        # A container its deadline stopped the client of is still running: removed, not left behind.
        with contextlib.suppress(DockerException):
            client(host).container.remove(name, force=True)
        _raise_if_hung(e, host, f"running {command[0]} in {ref}", CONTAINER_START_S)
        raise ImageError(
            f"running {command[0]} in {ref} failed: {_last_line(e)}", fix=f"docker run --rm {ref}"
        ) from None
    return str(out)


def probe_image(ref: str, script: str, *, env: Mapping[str, str], timeout: float, host: str | None = None) -> str:
    """``sh -c script`` in a throw-away container of ``ref``: no network, the image's own user and PATH, ``env``
    added; its standard output. ImageError with Docker's reason when it cannot start (an image without ``sh``),
    fails, or outlives ``timeout`` seconds (the container is then removed)."""
    import os
    import subprocess
    import uuid

    name = f"nodekit-probe-{uuid.uuid4().hex[:12]}"
    argv = _docker_argv(
        host, "run", "--rm", "--name", name, "--network", "none", "--pull", "never",
        *(a for k in sorted(env) for a in ("--env", k)), "--entrypoint", "sh", ref, "-c", script,
    )  # fmt: skip
    fix = f"docker run --rm --network none --entrypoint sh {ref} -c 'python3 -V'"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        with contextlib.suppress(subprocess.TimeoutExpired):  # the engine hung: the error below says so
            subprocess.run(
                _docker_argv(host, "rm", "-f", name), capture_output=True, check=False, timeout=ENGINE_CALL_S
            )
        raise ImageError(f"probing {ref} did not finish within {timeout:.0f} s", fix=fix) from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("docker:") or "Error" in ln), _tail(proc.stderr))
        if "executable file not found" in why or "no such file or directory" in why:
            raise ImageError(f"image {ref} has no /bin/sh (so no Python nodekit can use)", fix=fix)
        raise ImageError(f"probing {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return proc.stdout


def run_as_job(
    ref: str,
    script: str,
    *,
    ulimits: list[str] | None = None,
    gpus: bool = False,
    timeout: float | None = None,
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
    import subprocess

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
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        # Killing the client leaves the container running: remove it, or it would hold the ports and GPUs.
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(_docker_argv(host, "rm", "-f", name), capture_output=True, timeout=30)
        raise EngineError(
            f"a test container of {ref} did not finish within {timeout} s (it hung); it was removed", fix=fix
        ) from None
    if proc.returncode != 0:
        # docker run ends its stderr with "Run 'docker run --help' ..."; the reason is the "docker: Error ..." line.
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("docker:") or "Error" in ln), _tail(proc.stderr))
        raise EngineError(f"a test container of {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return proc.stdout


def remove_image(ref: str, host: str | None = None) -> None:
    """Remove the tag ``ref`` (layers other images share stay); a missing image is not an error."""
    from python_on_whales import DockerException

    try:
        if client(host).image.exists(ref):
            client(host).image.remove(ref, prune=False)
    except DockerException as e:
        _raise_if_hung(e, host, f"removing {ref}", ENGINE_CALL_S)
        raise ImageError(f"cannot remove {ref} on {_where(host)}: {_last_line(e)}", fix=f"docker rmi {ref}") from None


def load_archive(archive: Path) -> None:
    """``docker load`` an image archive from a file (the base image nodekit writes itself)."""
    from python_on_whales import DockerException

    try:
        client(deadline=LOAD_S).image.load(archive, quiet=True)
    except DockerException as e:
        _raise_if_hung(e, None, f"docker load of {archive}", LOAD_S)
        raise ImageError(f"docker load of {archive} failed: {_last_line(e)}", fix="nodekit base") from None


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
    import subprocess

    try:
        proc = subprocess.run(_docker_argv(host, *args), capture_output=True, text=True, timeout=ENGINE_CALL_S)
    except subprocess.TimeoutExpired:
        raise _hung(host, " ".join(("docker", *args[:2])), ENGINE_CALL_S) from None  # e.g. docker image ls
    if proc.returncode != 0:
        raise error(f"cannot {what} on {_where(host)}: {_tail(proc.stderr)}", fix=fix)
    return proc.stdout


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
