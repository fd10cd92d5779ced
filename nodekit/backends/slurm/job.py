"""What a Slurm job of the project is, decided before anything is written or submitted.

:func:`plan_job` is pure but for whether the training script exists: it takes the settings and the facts gathered
beforehand (the image's configuration, the job secret, the path of the converted image) and returns a frozen
:class:`SlurmJob`, which ``render`` turns into the sbatch script. Each rank's container is the one ``nodekit up``
would run on that node: the same planning (:func:`nodekit.job.plan.plan_container`), with main's address left a
hole (only Slurm knows which hosts the job gets): the script fills it, and the rank, per task.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from nodekit.config.inputs import sbatch_option_problem
from nodekit.config.settings import Settings
from nodekit.errors import UsageError
from nodekit.job.container import ContainerSpec
from nodekit.job.gather import check_command
from nodekit.job.plan import plan_container, unset_pass_env
from nodekit.job.spec import node_spec, pinned_host_facts
from nodekit.system.host.facts import HostFacts

Mode = Literal["docker", "charliecloud", "pyxis"]
MODES: tuple[str, ...] = get_args(Mode)
LOG_NAME = "slurm-%j.out"
# sbatch's own options that nodekit sets: one given again in sbatch_args would win over nodekit's (the last one
# counts), and the job would no longer be the one planned (one rank per node, the log where nodekit reads it).
# Each with the shortest abbreviation getopt_long takes for it (sbatch's other options share the shorter ones: --node
# is --nodefile, --nodelist or --nodes; --ntasks-per- five options; --o three), and the short forms.
OWN_OPTIONS = {"--nodes": "--nodes", "--ntasks-per-node": "--ntasks-per-n", "--output": "--ou"}
OWN_SHORT = {"-N": "--nodes", "-o": "--output"}


@dataclass(frozen=True)
class InspectedImage:
    """What the image says of itself (``docker image inspect``), gathered before planning."""

    ref: str
    id: str
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] = ()
    workdir: str = ""

    @classmethod
    def of(cls, ref: str, inspected: Mapping[str, Any]) -> InspectedImage:
        config = inspected.get("Config") or {}
        pairs = [str(e).partition("=") for e in config.get("Env") or ()]
        env = tuple((k, v) for k, sep, v in pairs if sep)
        return cls(
            ref=ref,
            id=str(inspected.get("Id", "")),
            env=env,
            entrypoint=tuple(config.get("Entrypoint") or ()),
            workdir=str(config.get("WorkingDir") or ""),
        )


@dataclass(frozen=True)
class Sbatch:
    """The job's ``#SBATCH`` options."""

    job_name: str
    nodes: int
    output: str
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmJob:
    name: str
    mode: Mode
    image: InspectedImage
    image_path: str  # charliecloud, pyxis: the SquashFS on a shared path; docker: ""
    sbatch: Sbatch
    nodes: tuple[ContainerSpec, ...]
    output_dir: str
    docker_host: str | None = None
    job_secret: str = ""
    report_token: str = ""
    """Tags each task's exit-code report for the verdict (render.VERDICT); a fresh random one per script."""
    notes: tuple[str, ...] = ()


def check_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise UsageError(
            f"unknown Slurm container mode {mode!r} (one of {', '.join(MODES)})",
            fix='set [slurm] container = "docker" (or "charliecloud", "pyxis") in nodekit.toml, or pass --container',
        )
    return mode  # type: ignore[return-value]


def plan_job(
    settings: Settings,
    image: InspectedImage,
    *,
    mode: Mode,
    job_secret: str,
    report_token: str,
    image_path: str = "",
    debug: bool = False,
    environ: Mapping[str, str] | None = None,
) -> SlurmJob:
    """The job, every rank planned as ``nodekit up`` plans a node. Raises UsageError; reads nothing itself but
    whether the training script exists.

    ``environ`` is the submitting shell's environment, only to warn about unset ``pass_env`` variables (Slurm
    passes that environment on to the job)."""
    check_mode(mode)
    if sourced := next((m for m in settings.mounts if m.source), None):
        raise UsageError(
            f"[[mounts]] {sourced.container} has source = {sourced.source!r}, which nodekit slurm cannot send to "
            "the allocation's nodes",
            fix="keep the data on the cluster's shared file system (or sbcast it in the job) and remove source",
        )
    launch = check_command(settings)
    if settings.network != "host":
        raise UsageError(
            f'network = "{settings.network}" cannot span Slurm nodes (NCCL and gloo need the hosts\' addresses)',
            fix="remove network from nodekit.toml (host networking) for nodekit slurm",
        )
    slurm = settings.slurm
    output_dir = settings.resolve(settings.output_dir).absolute()
    facts = HostFacts(gpu_count=slurm.gpus_per_node)
    runs = []
    for rank in range(settings.nnodes):
        node_f = pinned_host_facts(settings, rank, facts)
        node = node_spec(settings, launch, rank, None, node_f)  # main: the allocation's first host, at run time
        spec = plan_container(
            node, node_f, image=image.ref, output_dir=output_dir, image_id=image.id, job_secret=bool(job_secret),
            debug=debug,
        )  # fmt: skip
        runs.append(spec)
    if mode == "pyxis" and len({r.mounts for r in runs}) > 1:
        raise UsageError(
            'container = "pyxis" mounts the same paths on every node (one srun --container-mounts), but '
            "[nodes.R] mounts gives nodes different ones",
            fix='remove the per-node mounts, or use container = "docker" or "charliecloud"',
        )
    sbatch = Sbatch(
        job_name=settings.image_name,
        nodes=settings.nnodes,
        output=str(output_dir / LOG_NAME),
        gpus_per_node=slurm.gpus_per_node,
        partition=slurm.partition,
        account=slurm.account,
        time=slurm.time,
        extra=slurm.sbatch_args,
    )
    check_sbatch(sbatch)
    return SlurmJob(
        name=settings.image_name,
        mode=mode,
        image=image,
        image_path=image_path,
        sbatch=sbatch,
        nodes=tuple(runs),
        output_dir=str(output_dir),
        docker_host=slurm.docker_host,
        job_secret=job_secret,
        report_token=report_token,
        notes=unset_pass_env(launch.pass_env, environ or {}),
    )


def check_sbatch(s: Sbatch) -> None:
    """UsageError (one line) for an ``#SBATCH`` value sbatch cannot be given intact, or an ``sbatch_args`` item that
    would override nodekit's own options."""
    if "\\" in s.output:
        # A backslash anywhere in --output switches Slurm's %j substitution off: every job would write one file.
        raise UsageError(
            f"the job's log path {s.output!r} holds a backslash, which turns off Slurm's %j in it",
            fix="set output_dir to a path without a backslash",
        )
    for item in s.extra:
        problem = sbatch_option_problem(item)
        if problem is not None:  # first: a name that is not one word would slip past the check on nodekit's own
            raise UsageError(
                f"[slurm] sbatch_args {problem}",
                fix='write each option as one item, "--name=value" (e.g. "--qos=high") or "--flag"',
            )
        name = item.split("=", 1)[0]
        own = next((o for o, least in OWN_OPTIONS.items() if name.startswith(least) and o.startswith(name)), None)
        own = own or next((o for short, o in OWN_SHORT.items() if name.startswith(short) and name[1] != "-"), None)
        if own is not None:
            raise UsageError(
                f"[slurm] sbatch_args {item!r} would override nodekit's own {own} (the job is planned with "
                f"--nodes={s.nodes}, one task per node, and its log at {s.output})",
                fix=f"remove {item!r} from sbatch_args (set nnodes, or output_dir, instead)",
            )
    for line in sbatch_options(s):
        problem = sbatch_problem(line)
        if problem is not None:
            raise UsageError(f"#SBATCH {line}: {problem}", fix="change that value in [slurm] in nodekit.toml")


def sbatch_options(s: Sbatch) -> list[str]:
    """The job's ``#SBATCH`` options, each one word of sbatch's parser (:func:`sbatch_value`)."""
    opts = [f"--job-name={sbatch_value(s.job_name)}", f"--nodes={s.nodes}", "--ntasks-per-node=1"]
    if s.gpus_per_node:
        opts.append(f"--gpus-per-node={s.gpus_per_node}")
    opts += [
        f"--{k}={sbatch_value(v)}" for k, v in (("partition", s.partition), ("account", s.account), ("time", s.time))
        if v
    ]  # fmt: skip
    # --no-kill: a node that dies must not make Slurm kill (or requeue) the whole job before the survivors' watchdog
    # has named it and the script has exited with their verdict. --output: "%" in the directory is Slurm's
    # pattern character, written "%%" for a literal one.
    log_dir, _, log_name = s.output.rpartition("/")
    opts += [f"--output={sbatch_value(log_dir.replace('%', '%%') + '/' + log_name)}", "--no-requeue", "--no-kill"]
    for item in s.extra:  # the name is one plain word (check_sbatch), the value quoted: one word of sbatch's each
        name, eq, value = item.partition("=")
        opts.append(f"{name}={sbatch_value(value)}" if eq else item)
    return opts


# sbatch reads an #SBATCH line without a shell (src/sbatch/opt.c, _get_argument): whitespace ends a word unless
# quoted ('...' or "..."), a backslash takes the next character as it is (inside quotes too), an unquoted "#"
# ends the line. A word with none of these needs no quoting.
_SBATCH_PLAIN = re.compile(r"^[^\s\"'\\#]+$")


def sbatch_value(value: str) -> str:
    """``value`` as one word of sbatch's ``#SBATCH`` parser that it reads back as ``value``: as it is when nothing
    in it is special there, else double-quoted with ``\\`` and ``"`` escaped."""
    if _SBATCH_PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_problem(option: str) -> str | None:
    """Why ``option`` cannot be an ``#SBATCH`` line, or None: sbatch reads a line at a time, and turns the words
    packjob and hetjob (any case) into spaces wherever they appear (they separate the parts of a heterogeneous
    job)."""
    if any(c in option for c in "\n\r\0"):
        return "a value spans lines"
    if re.search("packjob|hetjob", option, re.IGNORECASE):
        return "sbatch reads packjob and hetjob in a line as a separator of job parts, even inside a value"
    return None


def squash_name(name: str, image_id: str) -> str:
    """The converted image's file name: one per image id, so a shared cache never serves another image."""
    return f"{name}-{image_id.removeprefix('sha256:')[:16]}.sqsh"


def image_path(settings: Settings, image_id: str) -> Path:
    return settings.resolve(settings.slurm.image_dir).absolute() / squash_name(settings.image_name, image_id)
