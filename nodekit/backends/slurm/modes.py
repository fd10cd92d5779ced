"""The container of one rank in each Slurm container mode, as lines of the task's shell (pure).

- docker: ``docker run`` with every field of the rank's :class:`~nodekit.job.container.ContainerSpec` (host network
  and IPC, init, ulimits, labels, environment, mounts, GPUs, devices), plus ``--rm``, a name per job and node and
  the label ``org.nodekit.slurm-job`` that the task's trap (or a site epilog) removes leftovers by;
- charliecloud: exactly the container's environment (the image's ENV, then the node's), set by the task's shell
  itself, then ``ch-run`` of the image on a shared path with the same mounts and working directory, the image's
  entrypoint and the job's command; a private /tmp; the SquashFS mount point and the image storage in a directory
  of the task's own (:func:`charliecloud_task`), never ch-run's per-user defaults;
- pyxis: the same environment and command, run by the task inside the container pyxis started (the srun options
  are in render.py): pyxis and enroot are not installable here, so this mode is rendered and golden-tested only.

Each rank's block sets ``nk_run`` (the argv) and ``nk_env``/``nk_pass`` (charliecloud, pyxis); the spec's holes are
the task's variables: the rank, main's address and, in docker mode, the image id on the node (see render.py). No
secret is ever an argument (every user of a node sees every process's arguments): the job secret and pass_env
travel by name, from the task's environment.
"""

from __future__ import annotations

from nodekit.backends.slurm.job import InspectedImage, Mode, SlurmJob
from nodekit.backends.slurm.shell import Part, Raw, Var, array, word
from nodekit.job.container import IMAGE_ID, MAIN_ADDR, RANK, ContainerSpec, Value, docker_mount
from nodekit.launcher.contract import Label

TASK_RANK = Var("nk_rank")
MAIN = Var("nk_main_addr")
NODE_IMAGE_ID = Var("nk_image_id")
JOB_ID = Var("SLURM_JOB_ID")
GPUS = Var("nk_gpus")
CHRUN = Var("nk_chrun")  # ch-run's absolute path: the container's clean environment has no PATH to find it by
CH_DIR = Var("nk_chdir")  # the task's own directory for ch-run (charliecloud_task)
# Where the task makes it: node-local on every distribution, where Charliecloud itself mounts by default.
CH_DIR_TEMPLATE = "/var/tmp/nodekit-slurm-ch.$SLURM_JOB_ID.$nk_rank.XXXXXX"
# ch-run's image storage, where it looks a name up (0.31 and later): its environment, not --storage, which ch-run
# 0.26 to 0.30 (Ubuntu 22.04 has 0.26) do not know and refuse.
CH_STORAGE = "CH_IMAGE_STORAGE"
JOB_LABEL = Label.SLURM_JOB
# Slurm's GPU selection for the task; charliecloud and pyxis pass it into the container's otherwise clean
# environment (docker mode turns it into --gpus device=...).
GPU_VARS = ("CUDA_VISIBLE_DEVICES",)
ULIMIT_FLAGS = {"memlock": "-l", "stack": "-s"}  # bash's ulimit flags (both in KiB)


def fill(value: Value, mode: Mode, spec: ContainerSpec) -> tuple[Part, ...]:
    """A value as the task writes it, its hole filled: the rank and main's address are the task's; the image id is
    what this node's engine says (docker), else the image's own (the SquashFS was made from it)."""
    if value == RANK:
        return (TASK_RANK,)
    if value == MAIN_ADDR:
        return (MAIN,)
    if value == IMAGE_ID:
        return (NODE_IMAGE_ID,) if mode == "docker" else (spec.image_id,)
    if isinstance(value, str):
        return (value,)
    raise ValueError(f"the Slurm task cannot fill {value}")  # a new hole must not pass silently


def container_name(job: SlurmJob) -> tuple[Part, ...]:
    return (f"nodekit-{job.name}-slurm", JOB_ID, "-node", TASK_RANK)


def docker_args(job: SlurmJob, spec: ContainerSpec) -> list[tuple[Part, ...]]:
    """``docker run``'s arguments for ``spec`` (after ``run``). Secrets and pass_env by name: docker takes their
    values from its own environment (the task's), so no value is in any process's arguments."""
    args: list[tuple[Part, ...]] = [
        ("--rm",),
        ("--pull=never",),
        ("--name=", *container_name(job)),
        (f"--label={JOB_LABEL}=", JOB_ID),
        (f"--network={spec.network}",),
        (f"--ipc={spec.ipc}",),
    ]
    if spec.init:
        args.append(("--init",))
    args.append((f"--stop-timeout={spec.stop_grace_s}",))
    if spec.workdir:
        args.append((f"--workdir={spec.workdir}",))
    for u in spec.ulimits:
        flag = ULIMIT_FLAGS.get(u.name)
        # This node's own hard limit decides (nodekit up's host facts do the same): asking for more than the engine
        # may raise to makes runc refuse to start the container. The word is empty when the limit stays as it is.
        args.append(
            (Raw(f"$(nk_ulimit {u.name} {flag} {u.hard})"),) if flag else (f"--ulimit={u.name}={u.soft}:{u.hard}",)
        )
    args += [(f"--label={key}=", *fill(value, "docker", spec)) for key, value in spec.labels]
    args += [(f"--env={v.name}=", *fill(v.value, "docker", spec)) for v in spec.env]
    args += [(f"--env={name}",) for name in (*spec.secrets, *spec.pass_env)]
    args += [(f"--mount={docker_mount(m)}",) for m in spec.mounts]
    if spec.gpus is not None:
        args.append(("--gpus=", GPUS))
    args += [(f"--device={d}:{d}",) for d in spec.devices]
    args += [(f"--cap-add={c}",) for c in spec.cap_add]
    return [*args, (spec.image,), *((c,) for c in spec.command)]


def container_env(job: SlurmJob, spec: ContainerSpec) -> list[tuple[Part, ...]]:
    """``NAME=value`` for every variable of the container: the image's ENV first, the node's over it (what
    Docker does); names passed by name (the job secret, pass_env) are left to the task (:func:`passed_names`)."""
    merged: dict[str, tuple[Part, ...]] = {k: (v,) for k, v in job.image.env}
    for v in spec.env:
        merged[v.name] = fill(v.value, job.mode, spec)
    for name in (*spec.secrets, *spec.pass_env):
        merged.pop(name, None)
    return [(f"{k}=", *v) for k, v in merged.items()]


def passed_names(spec: ContainerSpec) -> list[str]:
    """The variables the container takes by name from the task's environment: the job secret (the batch script
    exported it), pass_env, and Slurm's GPU selection."""
    names = [*spec.secrets, *spec.pass_env]
    return names + [g for g in GPU_VARS if spec.gpus is not None and g not in names]


def entry_argv(image: InspectedImage, spec: ContainerSpec) -> list[str]:
    return [*image.entrypoint, *spec.command]


def charliecloud_args(job: SlurmJob, spec: ContainerSpec) -> list[tuple[Part, ...]]:
    """``ch-run``'s argv for ``spec``: the task's own mount point and storage, binds, working directory, private
    /tmp, the image, the command."""
    args: list[tuple[Part, ...]] = [(CHRUN,), ("--private-tmp",), ("--unset-env=USER",)]
    args += [(f"--unset-env={CH_STORAGE}",), ("--mount=", CH_DIR, "/mnt")]
    args += [(f"--bind={m.source}:{m.target}",) for m in spec.mounts]
    workdir = spec.workdir or job.image.workdir
    if workdir:
        args.append((f"--cd={workdir}",))
    return [*args, (job.image_path,), ("--",), *((a,) for a in entry_argv(job.image, spec))]


def rank_block(job: SlurmJob, spec: ContainerSpec, indent: str) -> str:
    """The lines that set up rank ``spec.rank``'s container in the task (``nk_run``, and ``nk_env``/``nk_pass``
    where the task builds the container's environment itself)."""
    if job.mode == "docker":
        gpus = [] if spec.gpus is None else [f"{indent}nk_gpus=${{nk_slurm_gpus:-{spec.gpus}}}"]
        return "\n".join([*gpus, array("nk_run", docker_args(job, spec), indent=indent)])
    lines = [array("nk_env", container_env(job, spec), indent=indent)]
    names = passed_names(spec)
    if names:
        lines.append(array("nk_pass", names, indent=indent, per_line=8))
    else:
        lines.append(f"{indent}nk_pass=()")
    if job.mode == "charliecloud":
        lines.append(array("nk_run", charliecloud_args(job, spec), indent=indent))
        lines.append(f"{indent}nk_env+=({word((f'{CH_STORAGE}=', CH_DIR))})  # ch-run's own; dropped inside")
    else:
        lines.append(array("nk_run", [(a,) for a in entry_argv(job.image, spec)], indent=indent))
    return "\n".join(lines)


def charliecloud_task() -> list[str]:
    """The task's lines before its rank's block (which names the directory in ch-run's arguments): its own
    directory, made by ``mktemp -d`` (0700, a name no one can guess or make first, the job id and rank in it for an
    epilog's sweep) and removed when the task ends, by exit or by scancel's signal (a SIGKILL leaves an empty
    directory).

    ch-run's defaults are per user and node, not per task: two ch-run of one user on one node (two jobs on a shared
    node, or two virtual nodes) race to mkdir /var/tmp/$USER.ch/mnt, and the loser dies with "can't mkdir: File
    exists"; and /var/tmp is everyone's, so another user may make /var/tmp/$USER.ch first: a file there stops every
    ch-run of the user, and a directory under its img/ named like the image's path is run as the image (ch-run
    looks up a name in its storage before it opens a path). In the task's own directory neither can happen."""
    return [
        "# ch-run's SquashFS mount point and image storage: this task's own directory (its defaults under",
        "# /var/tmp/$USER.ch are shared by every ch-run of the user on this node, and anyone may make them first).",
        "nk_chdir=",
        'nk_chclean() { [ -z "$nk_chdir" ] || rmdir "$nk_chdir/mnt" "$nk_chdir" 2>/dev/null || true; }',
        "# scancel: remove it, then die of the signal (ch-run, in the same process group, has it too).",
        'nk_chsig() { nk_chclean; trap - "$1" EXIT; kill -s "$1" "$$"; }',
        "trap nk_chclean EXIT",
        "trap 'nk_chsig TERM' TERM; trap 'nk_chsig INT' INT; trap 'nk_chsig HUP' HUP",
        f'nk_chdir=$(mktemp -d "{CH_DIR_TEMPLATE}") && mkdir "$nk_chdir/mnt" || nk_fail "cannot make a directory '
        'for ch-run in /var/tmp" "free space or inodes in /var/tmp on this node, or make it writable"',
    ]


def pyxis_options(job: SlurmJob) -> list[str]:
    """srun's pyxis options (the same on every node: plan_job refuses per-node mounts in this mode)."""
    spec = job.nodes[0]
    mounts = ",".join(f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in spec.mounts)
    opts = [f"--container-image={job.image_path}", "--no-container-mount-home"]
    if mounts:
        opts.append(f"--container-mounts={mounts}")
    workdir = spec.workdir or job.image.workdir
    if workdir:
        opts.append(f"--container-workdir={workdir}")
    return [word(o) for o in opts]
