"""A node's compose project on an engine: up, logs, ps, wait, stop, down."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from nodekit.docker import calls
from nodekit.docker.calls import (
    CONTAINER_START_S,
    ENGINE_FIX,
    LASTS_AS_LONG_AS_THE_JOB,
    Engine,
    fails,
    where,
)
from nodekit.docker.models import ContainerState
from nodekit.errors import EngineError

if TYPE_CHECKING:
    from python_on_whales import DockerClient

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


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
    lost = f"lost {where(host)} while waiting for {project}"
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
    return (10 if timeout is None else timeout) + calls.ENGINE_CALL_S
