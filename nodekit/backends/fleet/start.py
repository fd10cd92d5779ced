"""One node's container started by its host's own ``docker run``, in one SSH command on the run's shared connection.

``nodekit run`` writes every node's compose file (what ``docker compose up`` by hand, ``nodekit down``, ``logs`` and
``status`` use), and an ``ssh://`` host's container is started from the same container spec
(nodekit/job/container.py) by :func:`run_args`: the same image, command, environment, mounts, limits, devices and
labels, and the labels Compose gives its own containers (project, service, number, config hash), so that Compose
and ``nodekit down`` find it as if ``compose up`` had made it. Before (issue 33), ``docker compose up`` ran on the head
through the docker CLI's ``ssh://`` transport: per node a docker CLI and the Compose plugin on the head (0.08 CPU s)
and a ``docker system dial-stdio`` on the host, on the path of every run; now the head holds one ``ssh`` client per
node for the start, and the host runs one docker CLI.

Values that must not appear in any process's arguments (the job secret, the user's ``pass_env``) travel on the SSH
command's standard input, base64 per line, and reach ``docker run`` by name through its environment, as they reach
Compose today. ``docker run`` takes every other value as one argument each: nothing is substituted, so a ``$`` in a
value is a ``$`` in the job (the compose file writes it ``$$``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from nodekit.backends.compose.node import NodePlan
from nodekit.backends.compose.render import SERVICE, fill
from nodekit.backends.fleet import remote
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import EngineError, ImageError
from nodekit.job.container import IMAGE_ID, ContainerSpec, docker_mount
from nodekit.launcher.contract import Env
from nodekit.system import proc
from nodekit.system.docker import calls

COMPOSE_LABELS = "com.docker.compose"
_NO_IMAGE = re.compile(r"No such image: (\S+?)\.?(?:\s|$)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# POSIX sh, run by the host's login over SSH after the variables NK_NAME and NK_DIRS and `set --` with docker run's
# arguments: the passed values from standard input (NAME=base64 lines, an empty line ends them), the outputs
# directories made where missing (Compose's create_host_path), then `docker run`; a container of the same name (an
# earlier run's, not removed) is replaced, as `compose up --force-recreate` does; one that was created but failed to
# start is removed again. Docker's own message goes to standard error.
START_SCRIPT = r"""
while IFS= read -r nk_line && [ -n "$nk_line" ]; do
  nk_value=$(printf '%s' "${nk_line#*=}" | base64 -d && printf x) || { echo "base64 -d failed here" >&2; exit 1; }
  export "${nk_line%%=*}=${nk_value%x}"
done
for nk_dir in $NK_DIRS; do mkdir -p "$(printf '%s' "$nk_dir" | base64 -d)" 2>/dev/null; done
nk_run() { docker run --detach --name "$NK_NAME" "$@" 2>&1 >/dev/null; }
if ! nk_said=$(nk_run "$@"); then
  case $nk_said in
    *"is already in use"*) docker rm --force "$NK_NAME" >/dev/null 2>&1; nk_said=$(nk_run "$@") && exit 0 ;;
  esac
  docker rm --force "$NK_NAME" >/dev/null 2>&1
  printf '%s\n' "$nk_said" >&2
  exit 1
fi
"""


def container_name(project: str) -> str:
    """The container's name: Compose's own for the node's project (``<project>-train-1``)."""
    return f"{project}-{SERVICE}-1"


def config_hash(compose_text: str) -> str:
    """The label Compose keys its containers by: here the hash of the node file the container was started from (a
    ``compose up`` by hand computes its own, differs, and recreates the container, as after any edit)."""
    return hashlib.sha256(compose_text.encode()).hexdigest()


def run_args(spec: ContainerSpec, *, project: str, compose_file: Path, compose_text: str) -> list[str]:
    """Pure: ``docker run``'s arguments for ``spec`` after ``--detach --name`` (the script adds those), the image
    and its command last. The job secret and ``pass_env`` by name only: docker takes their values from its own
    environment. A host network only: a bridge network's published ports stay Compose's (:func:`startable`)."""
    if spec.main_addr is None:
        raise ValueError("a node's container needs main's address (plan the node with it)")
    compose = {
        "project": project,
        "service": SERVICE,
        "container-number": "1",
        "oneoff": "False",
        "config-hash": config_hash(compose_text),
        "project.config_files": str(compose_file),
        "project.working_dir": str(compose_file.parent),
    }
    args = ["--pull=never", f"--network={spec.network}", f"--ipc={spec.ipc}", "--restart=no",
            f"--stop-timeout={spec.stop_grace_s}", f"--workdir={spec.workdir}"]  # fmt: skip
    if spec.init:
        args.append("--init")
    args += [f"--label={COMPOSE_LABELS}.{k}={v}" for k, v in compose.items()]
    args += [f"--label={k}={fill(spec, v)}" for k, v in spec.labels]
    known = [v for v in spec.env if not (v.value == IMAGE_ID and not spec.image_id)]
    args += [f"--env={v.name}={fill(spec, v.value)}" for v in known]
    args += [f"--env={name}" for name in dict.fromkeys((*spec.secrets, *spec.pass_env))]
    args += [f"--mount={docker_mount(m)}" for m in spec.mounts]
    args += [f"--ulimit={u.name}={u.soft}:{u.hard}" for u in spec.ulimits]
    if spec.gpus is not None:
        args.append(f"--gpus={spec.gpus}")
    args += [f"--device={d}:{d}" for d in spec.devices]
    args += [f"--cap-add={c}" for c in spec.cap_add]
    return [*args, spec.image, *spec.command]


def startable(spec: ContainerSpec) -> bool:
    """Whether :func:`start_command` starts this node (a host network); else ``compose up`` does."""
    return spec.network == "host" and not spec.ports


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def start_command(spec: ContainerSpec, *, project: str, compose_file: Path, compose_text: str) -> str:
    """The SSH command that starts ``spec``'s container on its host (:data:`START_SCRIPT` with its arguments)."""
    args = run_args(spec, project=project, compose_file=compose_file, compose_text=compose_text)
    dirs = " ".join(_b64(m.source) for m in spec.mounts if m.create)
    head = f"NK_NAME={shlex.quote(container_name(project))}\nNK_DIRS={shlex.quote(dirs)}\n"
    return head + "set -- " + " ".join(shlex.quote(a) for a in args) + "\n" + START_SCRIPT


def passed(spec: ContainerSpec, secrets: Mapping[str, str], environ: Mapping[str, str]) -> bytes:
    """The start command's standard input: ``NAME=base64(value)`` for each secret (its value from ``secrets``) and
    each ``pass_env`` name this shell sets (from ``environ``), then an empty line. A name that is not a variable
    name is a ValueError (the settings validated them; this keeps the script's ``export`` safe)."""
    lines = []
    for name in dict.fromkeys((*spec.secrets, *spec.pass_env)):
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a variable name: {name!r}")
        value = secrets.get(name) if name in spec.secrets else environ.get(name)
        if value is not None:
            lines.append(f"{name}={_b64(value)}")
    return ("\n".join(lines) + "\n\n").encode() if lines else b"\n"


def start(host: FleetHost, plan: NodePlan, *, environ: Mapping[str, str] | None = None) -> None:
    """Start ``plan``'s container on ``host`` (an ``ssh://`` host, :func:`startable` spec) in one SSH command on the
    run's shared connection. ImageError when the host's engine lacks the image (a start never pulls), EngineError
    for anything else Docker or SSH said; nothing of the node is left created either way."""
    spec = plan.container
    secrets = {Env.JOB_SECRET: plan.job_secret} if plan.job_secret else {}
    # The file's text without the secret: the label is readable by anyone who may inspect the container.
    command = start_command(spec, project=plan.project, compose_file=plan.compose_path, compose_text=plan.shown)
    what = f"docker run of node {spec.rank} on {host.where}"
    fix = f"ssh {host.target} docker ps -a (the engine there); nodekit down --node {spec.rank} once it answers"
    # A stop signal lets a start in flight end (stop_with=0, within the grace period) instead of ending this ssh:
    # the host's `docker run` would go on without it and could create the container after the run's `down`.
    done = proc.run(remote.ssh_argv(host, command), deadline=calls.CONTAINER_START_S, what=what, fix=fix,
                    given=passed(spec, secrets, os.environ if environ is None else environ), group=True,
                    stop_with=0)  # fmt: skip
    if done.returncode == 0:
        return
    if done.returncode == 255:
        problem = remote.ssh_problem(host, done.stderr)
        raise EngineError(f"{what} failed: {problem.what}", fix=problem.fix)
    if (missing := _NO_IMAGE.search(done.stderr)) is not None:
        raise ImageError(f"image {missing.group(1)} is not on {host.where}, and a start never pulls it",
                         fix=f"nodekit push {missing.group(1)} --to {host.url}")  # fmt: skip
    raise EngineError(f"{what} failed: {calls.stderr_tail(done.stderr)}", fix=fix)
