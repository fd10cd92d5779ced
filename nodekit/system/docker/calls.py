"""The client python-on-whales talks to Docker with, and the one way its calls fail (:meth:`Engine.calling`); the
queries nodekit runs as its own processes (through nodekit.system.proc) with the command line python-on-whales builds;
and the engine's own facts (versions, runtimes, identity and disk).

Every call has its deadline (:data:`ENGINE_CALL_S` for a query, more for what creates or loads, none for what lasts
as long as the job) and the environment of nodekit.system.proc's children, both from
:func:`nodekit.system.proc.command_prefix`.
The deadlines are read from this module when a call is made: set them here (a test's monkeypatch included).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nodekit.errors import DeadlineError, EngineError, NodekitError
from nodekit.system import proc
from nodekit.system.docker.models import EngineFacts, EngineInfo

if TYPE_CHECKING:
    from python_on_whales import DockerClient

_IMPORTING = threading.Lock()


def whales_loaded() -> None:
    """Import python-on-whales (lazily: `nodekit --help` does without it) in one thread at a time. Two threads that
    import it at once, one through the package and one through its ``exceptions`` module, can fail with CPython's
    _DeadlockError on the package's circular imports: `nodekit up` lists the project's images in a thread while its
    main thread inspects the base image (seen in CI). Every lazy import of it in nodekit comes after this call."""
    with _IMPORTING:
        import python_on_whales
        import python_on_whales.exceptions
        import python_on_whales.utils  # noqa: F401


ENGINE_FIX = "make engine (provisions Docker Engine with Compose v2 and Buildx), or start your Docker daemon"

# Deadlines of engine calls (seconds). A healthy engine answers a query in well under a second, over SSH in a few;
# minutes mean it hung (a wedged dockerd, a dead SSH link). Calls that last as long as the job (log follow, wait)
# and the image build (its own steps' time) have none.
ENGINE_CALL_S = 120.0
CONTAINER_START_S = 600.0  # compose up / a throw-away container: create and start, the image already local
LOAD_S = 1800.0  # docker load of a whole image archive from a file
LASTS_AS_LONG_AS_THE_JOB = proc.Unbounded("it lasts as long as the job (log follow, wait) or its own steps (build)")
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
    the runner's environment: both through :func:`nodekit.system.proc.command_prefix`."""
    whales_loaded()
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
        whales_loaded()
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
            raise error(last_line(e)) from None


def fails(kind: type[NodekitError], says: str, fix: str) -> Callable[[str], NodekitError]:
    """The error of a failed call: ``kind("<says>: <Docker's last line>", fix=fix)``."""
    return lambda why: kind(f"{says}: {why}", fix=fix)


def _hung(host: str | None, what: str, deadline: float) -> DeadlineError:
    """The error for an engine call that its deadline stopped."""
    return proc.hung(f"{what} on {where(host)}", deadline, hung_fix(host), cause="the engine hung")


def hung_fix(host: str | None) -> str:
    return f"check that engine: docker{' -H ' + host if host else ''} info; restart dockerd if it does not answer"


def _diagnose(host: str | None) -> None:
    """After a call failed: raise check_engine's precise EngineError when the engine or the Compose plugin is what
    is missing (the docker CLI's own words for that vary: "unknown flag: --file" when Compose is absent). The
    calls on every ``nodekit up`` do not check first (that costs 0.7 s); only a failure pays for the diagnosis."""
    check_engine(host, buildx=False)


def where(host: str | None) -> str:
    return host or "the local Docker engine"


def last_line(e: Exception) -> str:
    stderr = getattr(e, "stderr", None) or str(e)
    lines = [ln.strip() for ln in str(stderr).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def stderr_tail(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def docker_argv(host: str | None, *args: str) -> list[str]:
    """A docker command line for the runner (which applies its own deadline and environment), built by
    python-on-whales as for every other call (host, context, TLS and config flags)."""
    whales_loaded()
    from python_on_whales import DockerClient

    _require_cli()
    return [str(a) for a in DockerClient(host=host).client_config.docker_cmd] + list(args)


def compose_argv(host: str | None, compose_file: Path | None, project: str, *args: str) -> list[str]:
    """A ``docker compose`` command line for the runner, built by python-on-whales (host and config flags,
    ``--file``, ``--project-name``), as :func:`docker_argv` is."""
    whales_loaded()
    from python_on_whales import DockerClient

    _require_cli()
    d = DockerClient(host=host, compose_files=[compose_file] if compose_file else [], compose_project_name=project)
    return [str(a) for a in d.client_config.docker_compose_cmd] + list(args)


def query(
    host: str | None, *args: str, what: str, error: type[NodekitError] = EngineError, fix: str = ENGINE_FIX
) -> str:
    """One docker query run as our own process (the command line built by python-on-whales), under the query
    deadline; its standard output. ``error`` when it fails ("cannot ``what``"), DeadlineError when it hangs."""
    call = " ".join(("docker", *args[:2]))  # e.g. docker image ls
    done = proc.run(docker_argv(host, *args), deadline=ENGINE_CALL_S, what=f"{call} on {where(host)}",
                    fix=hung_fix(host), cause="the engine hung")  # fmt: skip
    if done.returncode != 0:
        raise error(f"cannot {what} on {where(host)}: {stderr_tail(done.stderr)}", fix=fix)
    return done.stdout


def inspect_listed(host: str | None, ls: tuple[str, ...], inspect: tuple[str, ...], *, what: str) -> str:
    """``docker image inspect [inspect...]`` of every image ``docker image ls [ls...]`` lists: two calls, whatever
    their number; "" when there is none. An image removed between the two calls makes inspect fail: ask again
    once, then give up."""

    def ids() -> list[str]:
        return sorted(set(query(host, "image", "ls", *ls, "--quiet", "--no-trunc", what=what).split()))

    listed = ids()
    if not listed:
        return ""
    try:
        return query(host, "image", "inspect", *inspect, *listed, what=what)
    except EngineError:
        listed = ids()
        return query(host, "image", "inspect", *inspect, *listed, what=what) if listed else ""


def check_engine(host: str | None = None, *, buildx: bool = True) -> EngineInfo:
    """Versions of the engine and of the Compose v2 and Buildx plugins; EngineError when any is missing. Running a
    job needs no Buildx: ``buildx=False`` skips that plugin (``buildx_version`` is then empty), the slowest of the
    three calls (0.15 s of about 0.3 s here), twice on the way from ``nodekit up`` to the container's start."""
    e = Engine(host)
    with e.calling("docker version", _no_engine(host)):
        server = e.docker.version().server
    if server is None:
        raise EngineError(f"no Docker engine answers at {where(host)}", fix=ENGINE_FIX)
    compose = compose_version(host, e)
    buildx_version = ""
    if buildx:
        with e.calling("docker buildx version", _missing("Buildx", "buildx")):
            buildx_version = e.docker.buildx.version()
    return EngineInfo(
        host=where(host), server_version=str(server.version), compose_version=compose, buildx_version=buildx_version
    )


def compose_version(host: str | None = None, engine: Engine | None = None) -> str:
    """The version of the Compose v2 plugin that runs the job's containers for ``host``: the plugin of this machine's
    docker CLI, whatever engine it then talks to. EngineError when it is missing."""
    e = engine or Engine(host)
    with e.calling("docker compose version", _missing("Compose v2", "compose")):
        return str(e.docker.compose.version())


def _missing(plugin: str, command: str) -> Callable[[str], NodekitError]:
    return lambda _: EngineError(f"Docker {plugin} (the `docker {command}` plugin) is missing", fix=ENGINE_FIX)


def no_engine_line(host: str | None, why: str) -> str:
    """The line for an engine that does not answer at ``host`` (``why``: Docker's own words)."""
    return f"no Docker engine answers at {where(host)} ({why})"


def _no_engine(host: str | None) -> Callable[[str], NodekitError]:
    return lambda why: EngineError(no_engine_line(host, why), fix=ENGINE_FIX)


def runtimes(host: str | None = None) -> tuple[str, ...]:
    """The container runtimes the engine at ``host`` offers (``nvidia`` where the NVIDIA toolkit is set up)."""
    e = Engine(host)
    with e.calling("docker info", _no_engine(host)):
        info = e.docker.system.info()
    return tuple(sorted((info.runtimes or {}).keys()))


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
