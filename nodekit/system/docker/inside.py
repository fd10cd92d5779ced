"""Commands inside a node's job container (``nodekit exec``): the container of a compose project, the ``docker
exec`` command line for one that runs, and for one that has ended (its container kept) a snapshot of it
(``docker commit``) started as a throw-away container set up as the job's was (its mounts, network, IPC, GPUs and
limits), so that the user finds the files, environment and mounts the job left.

The command lines are built here (python-on-whales' flags for the engine); the caller runs them through
nodekit.system.proc, with the terminal when the user's stdin is one.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from nodekit.errors import EngineError
from nodekit.system import proc
from nodekit.system.docker import calls
from nodekit.system.docker.calls import CONTAINER_START_S, docker_argv, hung_fix, query, stderr_tail, where

PROJECT_LABEL = "com.docker.compose.project"
SNAPSHOT_REPO = "nodekit-exec"


@dataclass(frozen=True)
class JobContainer:
    """What ``exec`` needs of a node's container, from ``docker inspect``."""

    id: str
    name: str
    running: bool
    status: str
    network: str = ""
    ipc: str = ""
    gpus: bool = False
    ulimits: tuple[str, ...] = ()


def parse_container(doc: dict[str, object]) -> JobContainer:
    """One ``docker inspect`` document as a JobContainer (pure)."""
    state = doc.get("State") if isinstance(doc.get("State"), dict) else {}
    host = doc.get("HostConfig") if isinstance(doc.get("HostConfig"), dict) else {}
    assert isinstance(state, dict) and isinstance(host, dict)
    limits = tuple(
        f"{u['Name']}={u['Soft']}:{u['Hard']}" for u in host.get("Ulimits") or [] if isinstance(u, dict) and "Name" in u
    )
    return JobContainer(
        id=str(doc.get("Id", "")),
        name=str(doc.get("Name", "")).lstrip("/"),
        running=bool(state.get("Running")),
        status=str(state.get("Status", "")),
        network=str(host.get("NetworkMode") or ""),
        ipc=str(host.get("IpcMode") or ""),
        gpus=bool(host.get("DeviceRequests")),
        ulimits=limits,
    )


def job_container(project: str, host: str | None = None) -> JobContainer | None:
    """The container of compose project ``project`` on ``host``'s engine (running or ended), None when there is
    none. EngineError when the engine cannot be asked."""
    ids = query(host, "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label={PROJECT_LABEL}={project}",
                what=f"list the containers of {project}").split()  # fmt: skip
    if not ids:
        return None
    docs = json.loads(query(host, "container", "inspect", *ids, what=f"inspect the container of {project}"))
    found = [parse_container(d) for d in docs if isinstance(d, dict)]
    found.sort(key=lambda c: not c.running)  # a running one first (a restart's leftover is not the job)
    return found[0] if found else None


def exec_argv(host: str | None, container: str, command: Sequence[str], *, stdin: bool, tty: bool) -> list[str]:
    """``docker exec [-i] [-t] CONTAINER COMMAND...``."""
    return docker_argv(host, "exec", *(["-i"] if stdin else []), *(["-t"] if tty else []), container, *command)


def snapshot(c: JobContainer, host: str | None = None) -> str:
    """``docker commit`` of an ended container: the image (its id) a throw-away copy runs from. The caller
    removes it (:func:`drop_snapshot`)."""
    ref = f"{SNAPSHOT_REPO}/{c.name or c.id[:12]}:{secrets.token_hex(4)}"
    done = proc.run(docker_argv(host, "commit", "--pause=false", c.id, ref), deadline=CONTAINER_START_S,
                    what=f"docker commit of {c.name} on {where(host)}", fix=hung_fix(host))  # fmt: skip
    if done.returncode != 0:
        raise EngineError(f"cannot snapshot the ended container {c.name} on {where(host)}: "
                          f"{stderr_tail(done.stderr)}", fix=f"docker start {c.name}, then docker exec")  # fmt: skip
    return ref


def snapshot_argv(
    host: str | None, c: JobContainer, image: str, command: Sequence[str], *, stdin: bool, tty: bool
) -> list[str]:
    """``docker run --rm`` of ``image`` (a snapshot of ``c``) with ``c``'s mounts (``--volumes-from``), network,
    IPC, GPUs and limits, ``command`` instead of the launcher; relabelled so that it is never counted as the job's
    container (a snapshot keeps the compose labels)."""
    opts = ["--rm", *(["-i"] if stdin else []), *(["-t"] if tty else []), "--volumes-from", c.id,
            "--label", f"{PROJECT_LABEL}={SNAPSHOT_REPO}", "--pull", "never"]  # fmt: skip
    if c.network:
        opts += ["--network", c.network]
    if c.ipc in ("host", "private", "shareable"):
        opts += ["--ipc", c.ipc]
    if c.gpus:
        opts += ["--gpus", "all"]
    opts += [f"--ulimit={u}" for u in c.ulimits]
    return docker_argv(host, "run", *opts, "--entrypoint", command[0], image, *command[1:])


def drop_snapshot(image: str, host: str | None = None) -> None:
    """Remove a snapshot image (its layers shared with the job's image stay); a failure is not the user's problem
    beyond a leftover tag, so it is not raised."""
    proc.run(docker_argv(host, "image", "rm", "--force", image), deadline=calls.ENGINE_CALL_S,
             what=f"docker image rm {image}", fix=hung_fix(host))  # fmt: skip
