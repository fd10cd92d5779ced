"""A node's compose project on an engine: up, logs, ps, wait, exec, stop, down.

Everything but ``ps`` runs as nodekit's own process (the command line built by python-on-whales, as for every call)
in a process group of its own, listed in nodekit.system.proc's registry: a signal to nodekit ends ``docker compose up``
and everything it started (the docker CLI, its ssh) before ``down`` runs, so nothing is created after the node was
removed. Before, only a ``timeout`` wrapper was killed and the orphaned ``compose up`` created the container later.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from nodekit.errors import DeadlineError, EngineError, ImageError
from nodekit.system import proc
from nodekit.system.docker import calls
from nodekit.system.docker.calls import (
    ENGINE_FIX,
    LASTS_AS_LONG_AS_THE_JOB,
    Engine,
    compose_argv,
    docker_argv,
    fails,
    stderr_tail,
    where,
)
from nodekit.system.docker.models import ContainerState
from nodekit.system.docker.streams import Drain
from nodekit.system.terminal import ESCAPES


def _run(argv: list[str], what: str, host: str | None, deadline: float | proc.Unbounded) -> proc.Result:
    """A compose or container call in its own process group, under ``deadline``: its result (the caller judges
    the exit code), DeadlineError once the deadline stopped it."""
    return proc.run(argv, deadline=deadline, what=f"{what} on {where(host)}", fix=calls.hung_fix(host),
                    cause="the engine hung", stdin="devnull", group=True)  # fmt: skip


_NO_IMAGE = re.compile(r"No such image: (\S+)")


def compose_up(compose_file: Path, project: str, *, host: str | None = None) -> None:
    """Create and start the node's container in the background (recreated if it exists) on ``host``'s engine.
    ImageError naming the image and the push that fixes it when the engine lacks it (rendered files say
    ``pull_policy: never``: a start never pulls)."""
    argv = compose_argv(host, compose_file, project, "up", "--detach", "--force-recreate")
    fix = f"docker compose -f {compose_file} up  (to see Docker's full output)"
    try:
        done = _run(argv, f"docker compose up of {compose_file}", host, calls.CONTAINER_START_S)
    except DeadlineError:
        _undo_up(compose_file, project, host)
        raise
    if done.returncode != 0:
        # Nothing half-running: a container that was created but failed to start is removed again.
        _undo_up(compose_file, project, host)
        calls.check_engine(host, buildx=False)  # the engine or the Compose plugin missing: that precise line
        missing = _NO_IMAGE.search(done.stderr)
        if missing is not None:
            ref = missing.group(1)
            push = (
                f"nodekit push {ref} --to {host}" if host else f"nodekit build, or nodekit push {ref} from its engine"
            )
            raise ImageError(f"image {ref} is not on {where(host)}, and a start never pulls it", fix=push)
        raise EngineError(f"docker compose up failed for {compose_file}: {stderr_tail(done.stderr)}", fix=fix)


def _undo_up(compose_file: Path, project: str, host: str | None) -> None:
    """After a failed or hung ``up`` (not after Ctrl-C or a signal: the caller's ``down`` comes then)."""
    with contextlib.suppress(Exception):
        _run(compose_argv(host, compose_file, project, "down", "--remove-orphans"), "docker compose down", host,
             calls.ENGINE_CALL_S)  # fmt: skip


def running(project: str, *, host: str | None = None) -> list[str]:
    """The running containers of compose project ``project`` on ``host``'s engine: ``name (Up 3 minutes)`` each."""
    out = calls.query(host, "ps", "--filter", f"label=com.docker.compose.project={project}", "--format",
                      "{{.Names}} ({{.Status}})", what=f"list the containers of {project}")  # fmt: skip
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def compose_logs(
    compose_file: Path | None, project: str, *, follow: bool, tail: str | None = None, host: str | None = None
) -> Iterator[str]:
    """The job's output line by line; with ``follow`` it ends when the container stops. EngineError when the
    stream is lost (over ssh://, a host that stops answering ends it within the connection's keepalive).

    A line the job ended with a carriage return alone (a progress bar that redraws itself: tqdm) keeps that "\r" at
    its end, so the printer can show it as one updating line (nodekit.system.bars); every other line comes without
    its ending. Empty redraws are left out."""
    args = [
        "logs",
        "--no-color",
        *(["--follow"] if follow else []),
        "--no-log-prefix",
        *(["--tail", tail] if tail else []),
    ]
    out = JobOutput(compose_argv(host, compose_file, project, *args), what=f"docker compose logs of {project}")
    yield from out
    if out.returncode != 0:
        raise EngineError(f"lost the log stream of {project} on {where(host)}: {stderr_tail(out.stderr())}",
                          fix=f"docker compose -p {project} ps  (is it running?)")  # fmt: skip


class JobOutput:
    """A command that prints a job's output (``docker compose logs``, or a host's own ``docker logs`` over SSH), run
    as nodekit's own process in a group of its own, read line by line as the printer takes it: each line without its
    ending, a carriage-return redraw with its "\\r", terminal control sequences and empty redraws left out, the last
    line as it is. Its standard error is collected beside it. Once iterated to the end (or left early: the command
    is then killed), ``returncode`` and :meth:`stderr` say how it ended."""

    def __init__(self, argv: list[str], *, what: str) -> None:
        self._child = proc.start(argv, deadline=LASTS_AS_LONG_AS_THE_JOB, what=what, stdin="devnull", stdout="pipe",
                                 stderr="pipe", group=True)  # fmt: skip
        assert self._child.stderr is not None
        self._stderr = Drain(self._child.stderr)
        self.returncode = -1

    def __iter__(self) -> Iterator[str]:
        try:
            for text in self._child.lines(keep_ends=True):
                # Compose writes terminal control sequences (erase-line) even with --no-color; they garble prefixed
                # logs.
                line = ESCAPES.sub("", text)
                if line.endswith("\n"):
                    yield line.rstrip("\r\n")
                elif line.endswith("\r"):
                    if line.strip():
                        yield line.rstrip("\r") + "\r"
                else:
                    yield line  # the last line, without an ending
        finally:
            if self._child.poll() is None:
                self._child.kill()
            code = self._child.wait()  # no timeout: it has ended or was killed
            self.returncode = -1 if code is None else code

    def stderr(self) -> str:
        return self._stderr.text()


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


def compose_projects(prefix: str, *, host: str | None = None) -> list[str]:
    """The compose projects on ``host``'s engine whose names start with ``prefix``, running or stopped, sorted."""
    e = Engine(host)
    with e.calling("docker compose ls", fails(EngineError, "cannot list the compose projects", ENGINE_FIX)):
        projects = e.docker.compose.ls(all=True, filters={"name": prefix})
    return sorted(str(p.name) for p in projects if str(p.name).startswith(prefix))


def compose_wait(
    compose_file: Path | None, project: str, *, service: str | None = None, host: str | None = None
) -> int:
    """Block until the node's container exits; its exit code. EngineError when the engine cannot be asked (over
    ssh://, a host that stops answering is noticed within the connection's keepalive).

    With ``service``, one call where Compose named the container as it does (``<project>-<service>-1``), as
    :func:`compose_exec` does: at a fleet run's start, where every host's calls share the head's cores, a
    ``compose ps`` first is one more docker CLI, Compose plugin and ``dial-stdio`` per host. Else, or where
    that name is not there (COMPOSE_COMPATIBILITY's ``_`` names), the project's container is listed first."""
    lost = f"lost {where(host)} while waiting for {project}"
    if service is not None:
        done = _run(docker_argv(host, "container", "wait", f"{project}-{service}-1"), "docker wait", host,
                    LASTS_AS_LONG_AS_THE_JOB)  # fmt: skip
        if done.returncode == 0 or not _NOT_THERE.search(done.stderr):
            return _exit_code(done, lost)
    ps = compose_argv(host, compose_file, project, "ps", "--quiet", "--all")
    listed = _run(ps, f"docker compose ps of {project}", host, calls.ENGINE_CALL_S)
    if listed.returncode != 0:
        raise EngineError(f"{lost}: {stderr_tail(listed.stderr)}", fix=ENGINE_FIX)
    ids = listed.stdout.split()
    if not ids:
        raise EngineError(f"compose project {project} has no container", fix="nodekit up")
    done = _run(docker_argv(host, "container", "wait", ids[0]), "docker wait", host, LASTS_AS_LONG_AS_THE_JOB)
    return _exit_code(done, lost)


def _exit_code(done: proc.Result, lost: str) -> int:
    if done.returncode != 0 or not done.stdout.split():
        raise EngineError(f"{lost}: {stderr_tail(done.stderr)}", fix=ENGINE_FIX)
    return int(done.stdout.split()[0])


_NOT_THERE = re.compile(r"No such container|is not running")


def compose_exec(
    compose_file: Path | None,
    project: str,
    service: str,
    argv: list[str],
    *,
    host: str | None = None,
    deadline: float = 60.0,
) -> proc.Result | None:
    """``argv`` run inside the project's running ``service`` container (``docker exec``), under ``deadline``: its result
    (the caller judges the exit code), or None when that container does not run on the engine. EngineError when the
    engine cannot be asked; DeadlineError once the deadline stopped the call.

    One call where Compose named the container as it does (``<project>-<service>-1``): over ssh:// every call is a
    connection of its own, the slow part. Else (COMPOSE_COMPATIBILITY's ``_`` names) the project's container is
    listed first. Not ``docker compose exec``: without ``--file`` it reads any compose file in the working directory
    and refuses a service that file lacks."""
    what = f"docker exec in {project}"
    done = _run(docker_argv(host, "exec", f"{project}-{service}-1", *argv), what, host, deadline)
    if done.returncode == 0 or not _NOT_THERE.search(done.stderr):
        return done
    ps = compose_argv(host, compose_file, project, "ps", "--quiet", service)
    listed = _run(ps, f"docker compose ps of {project}", host, calls.ENGINE_CALL_S)
    if listed.returncode != 0:
        raise EngineError(f"cannot list the containers of {project} on {where(host)}: {stderr_tail(listed.stderr)}",
                          fix=ENGINE_FIX)  # fmt: skip
    ids = listed.stdout.split()
    if not ids:
        return None
    done = _run(docker_argv(host, "exec", ids[0], *argv), what, host, deadline)
    return None if done.returncode != 0 and _NOT_THERE.search(done.stderr) else done


def compose_stop(
    compose_file: Path | None, project: str, *, timeout: int | None = None, host: str | None = None
) -> None:
    _stopping("stop", compose_file, project, timeout, host)


def compose_down(
    compose_file: Path | None, project: str, *, timeout: int | None = None, host: str | None = None
) -> None:
    _stopping("down", compose_file, project, timeout, host)


def _stopping(verb: str, compose_file: Path | None, project: str, timeout: int | None, host: str | None) -> None:
    args = [
        verb,
        *(["--remove-orphans"] if verb == "down" else []),
        *(["--timeout", str(timeout)] if timeout is not None else []),
    ]
    done = _run(compose_argv(host, compose_file, project, *args), f"docker compose {verb} of {project}", host,
                _stop_deadline(timeout))  # fmt: skip
    if done.returncode != 0:
        raise EngineError(f"docker compose {verb} of {project} on {where(host)} failed: {stderr_tail(done.stderr)}",
                          fix=f"docker compose -p {project} {verb}")  # fmt: skip


def _stop_deadline(timeout: int | None) -> float:
    """Stopping waits up to ``timeout`` (Docker's default 10 s) per container before killing it, then removes."""
    return (10 if timeout is None else timeout) + calls.ENGINE_CALL_S
