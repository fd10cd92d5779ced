"""The container of one rank in each Slurm container mode, as lines of the task's shell (pure).

- docker: ``docker run`` with the keys ``nodekit up``'s compose file has (host network and IPC, init, ulimits,
  labels, environment, mounts, GPUs, devices), plus ``--rm``, a name per job and node and the label
  ``org.nodekit.slurm-job`` that the task's trap (or a site epilog) removes leftovers by.
- charliecloud: ``env -i`` with exactly the container's environment (the image's ENV, then the node's), then
  ``ch-run`` of the image on a shared path with the same mounts and working directory, the image's entrypoint and
  the job's command; a private /tmp.
- pyxis: the same ``env -i`` and command, run by the task inside the container pyxis started (the srun options are
  in render.py): pyxis and enroot are not installable here, so this mode is rendered and golden-tested only.

Each rank's block sets ``nk_run`` (the argv) and ``nk_env`` (charliecloud, pyxis); the rank, main's address and,
in docker mode, the image id on the node are the task's variables (see render.py).
"""

from __future__ import annotations

from nodekit.backends.slurm.job import (
    IMAGE_ID_ENV,
    MAIN_ENV,
    RANK_ENV,
    RANK_LABEL,
    ImageFacts,
    Mode,
    Mount,
    NodeRun,
    SlurmJob,
)
from nodekit.backends.slurm.shell import Part, Raw, Var, array, word

RANK = Var("nk_rank")
MAIN = Var("nk_main_addr")
IMAGE_ID = Var("nk_image_id")
JOB_ID = Var("SLURM_JOB_ID")
GPUS = Var("nk_gpus")
CHRUN = Var("nk_chrun")  # ch-run's absolute path: `env -i` leaves no PATH to find it by
JOB_LABEL = "org.nodekit.slurm-job"
# Slurm's GPU selection for the task; charliecloud and pyxis pass it into the container's otherwise clean
# environment (docker mode turns it into --gpus device=...).
GPU_VARS = ("CUDA_VISIBLE_DEVICES",)
ULIMIT_FLAGS = {"memlock": "-l", "stack": "-s"}  # bash's ulimit flags (both in KiB)


def env_value(key: str, value: str, mode: Mode) -> tuple[Part, ...]:
    """A variable's value as the task writes it: the rank, main and (docker) the image id are the task's."""
    if key == RANK_ENV:
        return (RANK,)
    if key == MAIN_ENV:
        return (MAIN,)
    if key == IMAGE_ID_ENV and mode == "docker":
        return (IMAGE_ID,)
    return (value,)


def container_name(job: SlurmJob) -> tuple[Part, ...]:
    return (f"nodekit-{job.name}-slurm", JOB_ID, "-node", RANK)


def docker_args(job: SlurmJob, run: NodeRun) -> list[tuple[Part, ...]]:
    """``docker run``'s arguments for ``run`` (after ``run``)."""
    args: list[tuple[Part, ...]] = [
        ("--rm",),
        ("--pull=never",),
        ("--name=", *container_name(job)),
        (f"--label={JOB_LABEL}=", JOB_ID),
    ]
    if run.network:
        args.append((f"--network={run.network}",))
    if run.ipc:
        args.append((f"--ipc={run.ipc}",))
    if run.init:
        args.append(("--init",))
    if run.stop_grace_s is not None:
        args.append((f"--stop-timeout={run.stop_grace_s}",))
    if run.workdir:
        args.append((f"--workdir={run.workdir}",))
    for name, soft, hard in run.ulimits:
        flag = ULIMIT_FLAGS.get(name)
        # This node's own hard limit decides (nodekit up's host facts do the same): asking for more than the engine
        # may raise to makes runc refuse to start the container. The word is empty when the limit stays as it is.
        args.append((Raw(f"$(nk_ulimit {name} {flag} {hard})"),) if flag else (f"--ulimit={name}={soft}:{hard}",))
    for key, value in run.labels:
        args.append((f"--label={key}=", RANK) if key == RANK_LABEL else (f"--label={key}={value}",))
    for key, env in run.env:
        args.append((f"--env={key}",) if env is None else (f"--env={key}=", *env_value(key, env, "docker")))
    args += [(f"--mount={_docker_mount(m)}",) for m in run.mounts]
    if run.gpus is not None:
        args.append(("--gpus=", GPUS))
    args += [(f"--device={d}",) for d in run.devices]
    args += [(f"--cap-add={c}",) for c in run.cap_add]
    return [*args, (run.image,), *((c,) for c in run.command)]


def _docker_mount(m: Mount) -> str:
    fields = ["type=bind", f"source={m.source}", f"target={m.target}"]
    if m.read_only:
        fields.append("readonly")
    return ",".join(_csv(f) for f in fields)


def _csv(field: str) -> str:
    """One field of ``--mount``'s comma-separated value (Go's encoding/csv: quoted when it holds , or ")."""
    return '"' + field.replace('"', '""') + '"' if any(c in field for c in ',"\n\r') else field


def container_env(job: SlurmJob, run: NodeRun) -> list[tuple[Part, ...]]:
    """``NAME=value`` for every variable of the container: the image's ENV first, the node's over it (what
    Docker does), names passed from the job's environment left to the task."""
    merged: dict[str, tuple[Part, ...]] = {k: (v,) for k, v in job.image.env}
    for key, value in run.env:
        if value is not None:
            merged[key] = env_value(key, value, job.mode)
        else:
            merged.pop(key, None)
    return [(f"{k}=", *v) for k, v in merged.items()]


def passed_names(job: SlurmJob, run: NodeRun) -> list[str]:
    names = [k for k, v in run.env if v is None]
    return names + [g for g in GPU_VARS if run.gpus is not None and g not in names]


def entry_argv(image: ImageFacts, run: NodeRun) -> list[str]:
    return [*image.entrypoint, *run.command]


def charliecloud_args(job: SlurmJob, run: NodeRun) -> list[tuple[Part, ...]]:
    """``ch-run``'s argv for ``run``: binds, working directory, private /tmp, the image, the command."""
    args: list[tuple[Part, ...]] = [(CHRUN,), ("--private-tmp",), ("--unset-env=USER",)]
    args += [(f"--bind={m.source}:{m.target}",) for m in run.mounts]
    workdir = run.workdir or job.image.workdir
    if workdir:
        args.append((f"--cd={workdir}",))
    return [*args, (job.image_path,), ("--",), *((a,) for a in entry_argv(job.image, run))]


def rank_block(job: SlurmJob, run: NodeRun, indent: str) -> str:
    """The lines that set up rank ``run.rank``'s container in the task (``nk_run``, and ``nk_env`` where the task
    builds the environment itself)."""
    if job.mode == "docker":
        gpus = [] if run.gpus is None else [f"{indent}nk_gpus=${{nk_slurm_gpus:-{run.gpus}}}"]
        return "\n".join([*gpus, array("nk_run", docker_args(job, run), indent=indent)])
    lines = [array("nk_env", container_env(job, run), indent=indent)]
    names = passed_names(job, run)
    if names:
        lines.append(array("nk_pass", names, indent=indent, per_line=8))
    else:
        lines.append(f"{indent}nk_pass=()")
    if job.mode == "charliecloud":
        lines.append(array("nk_run", charliecloud_args(job, run), indent=indent))
    else:
        lines.append(array("nk_run", [(a,) for a in entry_argv(job.image, run)], indent=indent))
    return "\n".join(lines)


def pyxis_options(job: SlurmJob) -> list[str]:
    """srun's pyxis options (the same on every node: plan_job refuses per-node mounts in this mode)."""
    run = job.nodes[0]
    mounts = ",".join(f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in run.mounts)
    opts = [f"--container-image={job.image_path}", "--no-container-mount-home"]
    if mounts:
        opts.append(f"--container-mounts={mounts}")
    workdir = run.workdir or job.image.workdir
    if workdir:
        opts.append(f"--container-workdir={workdir}")
    return [word(o) for o in opts]
