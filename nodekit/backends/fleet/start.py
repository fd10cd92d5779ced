"""One node's container started by its host's own ``docker run``, in one SSH command on the run's shared connection.

``nodekit run`` writes every node's compose file (what ``docker compose up`` by hand, ``nodekit down``, ``logs`` and
``status`` use), and an ``ssh://`` host's container is started from the same container spec
(nodekit/job/container.py) by :func:`run_args`: the same image, command, environment, mounts, limits, devices and
labels, and the labels Compose gives its own containers (project, service, number, config hash), so that Compose
and ``nodekit down`` find it as if ``compose up`` had made it. Not ``docker compose up`` through the docker CLI's
``ssh://`` transport, which costs per node a docker CLI and the Compose plugin on the head (0.08 CPU s) and a
``docker system dial-stdio`` on the host, on the path of every run: this way the head holds one ``ssh`` client per
node for the start, and the host runs one docker CLI.

Values that must not appear in any process's arguments (the job secret, the user's ``pass_env``) travel on the SSH
command's standard input, base64 per line, and reach ``docker run`` by name through its environment, as they reach
Compose. ``docker run`` takes every other value as one argument each: nothing is substituted, so a ``$`` in a
value is a ``$`` in the job (the compose file writes it ``$$``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from nodekit.backends.compose.node import NodePlan
from nodekit.backends.compose.render import SERVICE, fill
from nodekit.backends.fleet import remote
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import DeadlineError, EngineError, ImageError
from nodekit.job.container import IMAGE_ID, ContainerSpec, docker_mount
from nodekit.launcher.contract import Env
from nodekit.system import proc
from nodekit.system.docker import calls

COMPOSE_LABELS = "com.docker.compose"
_NO_IMAGE = re.compile(r"No such image: (\S+?)\.?(?:\s|$)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# POSIX sh, read by the host's `sh -s` from the SSH command's standard input (:func:`start_input`), after the
# variables NK_NAME, NK_DIRS and NK_PASSED and `set --` with docker run's arguments: the passed values exported
# (NAME=base64 words), the outputs directories made where missing (Compose's create_host_path), then `docker run`.
# A container of the same name that does not run (an earlier run's, left over) is replaced; a running one is not
# (another run of this project owns it: plain `docker rm` refuses a running container, atomically, in the engine),
# and the start fails naming it (exit 3). One that was created but failed to start is removed again. Docker's own
# message goes to standard error.
START_SCRIPT = r"""
for nk_line in $NK_PASSED; do
  nk_value=$(printf '%s' "${nk_line#*=}" | base64 -d && printf x) || { echo "base64 -d failed here" >&2; exit 1; }
  export "${nk_line%%=*}=${nk_value%x}"
done
for nk_dir in $NK_DIRS; do mkdir -p "$(printf '%s' "$nk_dir" | base64 -d)" 2>/dev/null; done
nk_run() { docker run --detach --name "$NK_NAME" "$@" 2>&1 >/dev/null; }
nk_said=$(nk_run "$@") && exit 0
case $nk_said in
  *"is already in use"*)
    if ! docker rm "$NK_NAME" >/dev/null 2>&1; then
      nk_state=$(docker inspect --format '{{.State.Status}}' "$NK_NAME" 2>/dev/null) && {
        printf 'container %s is %s on this host\n' "$NK_NAME" "$nk_state" >&2; exit 3; }
    fi
    nk_said=$(nk_run "$@") && exit 0
    case $nk_said in *"is already in use"*) printf '%s\n' "$nk_said" >&2; exit 3 ;; esac ;;
esac
docker rm --force "$NK_NAME" >/dev/null 2>&1
printf '%s\n' "$nk_said" >&2
exit 1
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


REMOTE_COMMAND = "sh -s"
"""What the start's and the settling's SSH commands run there: a shell that reads its script from standard input.
The start's script grows with the job (every node's values, 170 kB at 10,000 nodes with per-node GPUs): as an argument
of ``ssh`` and of the host's ``sh -c`` it passed Linux's 128 KiB bound on one argument (MAX_ARG_STRLEN): a pipe has
none."""
START_MARK = "nodekit-start"


def remote_start(project: str) -> str:
    """The start's SSH command: :data:`REMOTE_COMMAND` with arguments that name the container, which the script does
    not read (it sets its own) but which ``ps`` shows there, for :func:`settle` to find a start still in flight."""
    return f"{REMOTE_COMMAND} {START_MARK} {shlex.quote(container_name(project))}"


def start_command(
    spec: ContainerSpec, *, project: str, compose_file: Path, compose_text: str, args: Sequence[str] | None = None
) -> str:
    """The script that starts ``spec``'s container on its host (:data:`START_SCRIPT` with its arguments), without the
    passed values (:func:`start_input` adds them). ``args``: ``docker run``'s arguments as planned (the fleet's plan
    holds them), else :func:`run_args`'s."""
    if args is None:
        args = run_args(spec, project=project, compose_file=compose_file, compose_text=compose_text)
    dirs = " ".join(_b64(m.source) for m in spec.mounts if m.create)
    head = f"NK_NAME={shlex.quote(container_name(project))}\nNK_DIRS={shlex.quote(dirs)}\n"
    return head + "set -- " + " ".join(shlex.quote(a) for a in args) + "\n" + START_SCRIPT


def start_input(command: str, given: bytes) -> bytes:
    """The start's standard input: ``command`` (:func:`start_command`) after NK_PASSED, the :func:`passed` values
    as words, all in one brace group, which ``sh`` reads whole before it runs any of it, and whose commands read
    nothing of it (standard input /dev/null)."""
    words = " ".join(given.decode().split())
    return f"{{\nNK_PASSED='{words}'\n{command}\n}} </dev/null\n".encode()


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


class Unsettled(EngineError):
    """A stop signal ended a node's start, and its host could not be made sure to hold no container of it: the
    host's ``docker run`` may have created one after the run's ``down`` (``host``: where)."""

    def __init__(self, message: str, *, host: FleetHost, fix: str) -> None:
        super().__init__(message, fix=fix)
        self.host = host


def start(
    host: FleetHost,
    plan: NodePlan,
    *,
    environ: Mapping[str, str] | None = None,
    note: Callable[[str], None] | None = None,
    args: Sequence[str] | None = None,
) -> None:
    """Start ``plan``'s container on ``host`` (an ``ssh://`` host, :func:`startable` spec) in one SSH command on the
    run's shared connection, by ``docker run`` with ``args`` (the fleet's plan of it; None: :func:`run_args`'s).
    ImageError when the host's engine lacks the image (a start never pulls), EngineError for anything else Docker or
    SSH said; nothing of the node is left created either way.

    A stop signal (:func:`nodekit.system.proc.stopping`) gives a start in flight the grace period to end on its own;
    past it, its ssh is killed but the host's ``docker run`` goes on without it, so the node is settled there
    (:func:`settle`, ``note`` told first) and EngineError raised; :class:`Unsettled` when that host could not be."""
    spec = plan.container
    secrets = {Env.JOB_SECRET: plan.job_secret} if plan.job_secret else {}
    # The file's text without the secret: the label is readable by anyone who may inspect the container.
    command = start_command(
        spec, project=plan.project, compose_file=plan.compose_path, compose_text=plan.shown, args=args
    )
    given = passed(spec, secrets, os.environ if environ is None else environ)
    what = f"docker run of node {spec.rank} on {host.where}"
    fix = f"ssh {host.target} docker ps -a (the engine there); nodekit down --node {spec.rank} once it answers"
    # A stop signal lets a start in flight end (stop_with=0, within the grace period) instead of ending this ssh at
    # once: the host's `docker run` goes on without it and may create the container after the run's `down`.
    argv = remote.ssh_argv(host, remote_start(plan.project))
    done = proc.run(argv, deadline=calls.CONTAINER_START_S, what=what, fix=fix, given=start_input(command, given),
                    group=True, stop_with=0)  # fmt: skip
    if done.returncode == 0:
        return
    if done.returncode < 0 and proc.interrupted():
        if note is not None:
            note(f"node {spec.rank}'s docker run on {host.where} outlived the stop's grace: removing its container "
                 f"there once it ends (at most {SETTLE_S:g} s)")  # fmt: skip
        if (why := settle(host, plan.project)) is not None:
            raise Unsettled(f"node {spec.rank}'s container on {host.where} may be left there ({why})", host=host,
                            fix=f"nodekit down --node {spec.rank} once {host.hostname} answers")  # fmt: skip
        raise EngineError(f"{what} was stopped; nothing of it is left there", fix=fix)
    if done.returncode == 255:
        problem = remote.ssh_problem(host, done.stderr)
        raise EngineError(f"{what} failed: {problem.what}", fix=problem.fix)
    if (missing := _NO_IMAGE.search(done.stderr)) is not None:
        raise ImageError(f"image {missing.group(1)} is not on {host.where}, and a start never pulls it",
                         fix=f"nodekit push {missing.group(1)} --to {host.url}")  # fmt: skip
    if done.returncode == 3:
        raise EngineError(f"{what} failed: {calls.stderr_tail(done.stderr)}, which this run does not replace",
                          fix=f"nodekit status (another run of this project?); nodekit down --node {spec.rank} "
                          "if it is left over")  # fmt: skip
    raise EngineError(f"{what} failed: {calls.stderr_tail(done.stderr)}", fix=fix)


SETTLE_S = 60
"""How long :func:`settle` waits on a host for a start's ``docker run`` that outlived its ssh (an engine that takes
this long to create and start a container hung)."""

# POSIX sh, read by the host's `sh -s` after NK_NAME and NK_WAIT: wait (at most NK_WAIT s) until no start of this
# container runs there (its shell, :func:`remote_start`, which may not have reached `docker run` yet, or its `docker
# run`; found by their arguments, which `ps` shows; `[s]` and `[d]` keep grep from finding itself), then remove the
# container. One still running then (a hung engine) is killed, and the container removed once more: exit 4. Exit 5:
# its engine does not say that the container is gone.
SETTLE_SCRIPT = r"""
nk_busy() {
  ps -eo pid=,args= 2>/dev/null \
    | grep -e "[s]h -s nodekit-start $NK_NAME\$" -e "[d]ocker run --detach --name $NK_NAME " | awk '{ print $1 }'
}
nk_end=$(( $(date +%s) + NK_WAIT ))
while [ -n "$(nk_busy)" ] && [ "$(date +%s)" -lt "$nk_end" ]; do sleep 0.2; done
nk_left=$(nk_busy)
[ -z "$nk_left" ] || kill -KILL $nk_left 2>/dev/null
docker rm --force "$NK_NAME" >/dev/null 2>&1
if [ -n "$nk_left" ]; then
  sleep 1; docker rm --force "$NK_NAME" >/dev/null 2>&1
  echo "its docker run still ran after ${NK_WAIT} s and was killed; the engine may still create the container" >&2
  exit 4
fi
nk_said=$(docker inspect --format '{{.State.Status}}' "$NK_NAME" 2>&1) || case $nk_said in *"o such"*) exit 0 ;; esac
echo "docker rm --force $NK_NAME did not remove it ($nk_said)" >&2
exit 5
"""


def settle(host: FleetHost, project: str, *, wait_s: int = SETTLE_S) -> str | None:
    """Make sure ``host`` holds no container of ``project`` once its start's ``docker run``, which a stop signal cut
    off from its ssh, has ended (:data:`SETTLE_SCRIPT`, one SSH command on the run's shared connection). None when
    it holds none; else why not, in a few words (the host cannot be reached, its engine hung)."""
    script = f"{{\nNK_NAME={shlex.quote(container_name(project))}\nNK_WAIT={wait_s:d}\n{SETTLE_SCRIPT}\n}} </dev/null\n"
    deadline = wait_s + remote.SSH_DEADLINE_S + 30
    try:
        done = proc.run(remote.ssh_argv(host, REMOTE_COMMAND), deadline=deadline, what=f"settling {host.where}",
                        fix="", given=script.encode(), group=True)  # fmt: skip
    except DeadlineError:
        return f"{host.hostname} did not answer within {deadline:g} s"
    if done.returncode == 0:
        return None
    if done.returncode == 255:
        return remote.ssh_problem(host, done.stderr).what
    return calls.stderr_tail(done.stderr) or f"exit code {done.returncode}"
