"""``nodekit slurm``'s side effects, in order: gather -> check -> prepare the image -> write -> submit -> follow.

- gather: the image (the one ``nodekit up`` would run, or ``--image``) and what it says of itself, the job secret;
- check, before anything is written or submitted (bad input: one line, exit 2): the Slurm client on PATH, what
  ``sbatch --test-only`` says of the request (partition, GPUs, time, account, the extra options), the tools the
  container mode needs here (``mksquashfs``; pyxis: ``enroot`` and srun's ``--container-image``);
- prepare: charliecloud and pyxis convert the image into a SquashFS on the shared ``image_dir``, once per image id
  (a cache: the file's name carries the id); docker pushes the image to the ``push_to`` engines through nodekit's
  own shipping (only what each lacks). The tools on the nodes themselves are checked by the job's first lines:
  a node without them ends the job with exit 2, naming itself and the fix, before any container starts;
- submit and follow: ``sbatch --parsable``, then the state and the log until the job ends; the job's exit code is
  the failing node's (the script decides it, see render.py). Ctrl-C, SIGTERM and SIGHUP ``scancel`` the job.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nodekit.backends.shape import BackendPlan, PlannedFile
from nodekit.backends.slurm import cmd, follow
from nodekit.backends.slurm.job import InspectedImage, Mode, SlurmJob, check_mode, plan_job
from nodekit.backends.slurm.render import render
from nodekit.config.settings import Settings
from nodekit.errors import JobFailed, UsageError
from nodekit.launcher.contract import OUTPUT_DIR
from nodekit.runs.events import NO_EVENTS, RunEvents
from nodekit.system.files import write_atomic
from nodekit.system.progress import Reporter

CLIENT_FIX = "run nodekit slurm on a login node of the cluster, or install the Slurm client (Debian: slurm-client)"


@dataclass(frozen=True)
class Prepared:
    job: SlurmJob
    script: str
    path: Path
    project_dir: Path


def gather_image(settings: Settings, image: str | None) -> InspectedImage:
    """The image to run (``nodekit up``'s choice when none is named) as its engine here describes it."""
    from nodekit.image.builder import choose
    from nodekit.system import docker

    ref = image or choose(settings).ref
    return InspectedImage.of(ref, docker.image_config(ref))


def mount_targets(settings: Settings) -> tuple[str, ...]:
    """Where the container mounts things: ch-run binds onto existing directories only, so the SquashFS has them."""
    return tuple(sorted({OUTPUT_DIR, *(m.container for m in settings.mounts)}))


def image_file(settings: Settings, image_id: str, mode: Mode) -> Path:
    """The converted image on the shared path: one file per image id (and set of mount points), so the cache never
    serves another image."""
    short = image_id.removeprefix("sha256:")[:16]
    extra = ""
    if mode == "charliecloud" and mount_targets(settings) != (OUTPUT_DIR,):
        extra = "-" + hashlib.sha256("\n".join(mount_targets(settings)).encode()).hexdigest()[:8]
    suffix = "sqsh" if mode == "charliecloud" else "enroot.sqsh"
    return settings.resolve(settings.slurm.image_dir).absolute() / f"{settings.image_name}-{short}{extra}.{suffix}"


def script_path(settings: Settings, out: Path | None) -> Path:
    return out or settings.resolve(settings.compose_dir) / "slurm.sbatch"


def prepare(
    settings: Settings,
    *,
    mode: str | None,
    image: str | None,
    out: Path | None,
    job_secret: Callable[[], str],
    environ: Mapping[str, str],
    debug: bool = False,
) -> Prepared:
    """Plan the job and render its script; writes nothing."""
    chosen = check_mode(mode or settings.slurm.container)
    facts = gather_image(settings, image)
    path = "" if chosen == "docker" else str(image_file(settings, facts.id, chosen))
    job = plan_job(settings, facts, mode=chosen, job_secret=job_secret(), report_token=secrets.token_hex(16),
                   image_path=path, debug=debug, environ=environ)  # fmt: skip
    return Prepared(job=job, script=render(job), path=script_path(settings, out), project_dir=settings.project_dir)


def plan(
    settings: Settings,
    *,
    mode: str | None,
    image: str | None,
    out: Path | None,
    job_secret: Callable[[], str],
    environ: Mapping[str, str],
    debug: bool = False,
) -> BackendPlan[Prepared]:
    """:func:`prepare` in the shape every backend returns: the script (the job secret masked when shown) and the
    job's notes, which are warnings here (each is said again when the script is written or submitted)."""
    p = prepare(settings, mode=mode, image=image, out=out, job_secret=job_secret, environ=environ, debug=debug)
    return as_plan(p)


def as_plan(p: Prepared) -> BackendPlan[Prepared]:
    return BackendPlan(
        "slurm", p, files=(PlannedFile(p.path, p.script, secret=p.job.job_secret),), warnings=p.job.notes
    )


def check_submit(prepared: Prepared) -> None:
    """What can be known before submitting: the client, what sbatch accepts, the mode's tools here."""
    for tool in ("sbatch", "scontrol", "scancel"):
        if shutil.which(tool) is None:
            raise UsageError(f"no Slurm client here: {tool} is not on PATH", fix=CLIENT_FIX)
    test = cmd.run(["sbatch", "--test-only"], stdin=prepared.script)
    if test.code != 0:
        raise UsageError(
            f"sbatch refuses the job: {test.message}",
            fix="check [slurm] partition, gpus_per_node, time, account and sbatch_args in nodekit.toml (sinfo lists "
            "the partitions)",
        )
    check_tools(prepared.job.mode, Path(prepared.job.image_path) if prepared.job.image_path else None)


def check_tools(mode: Mode, image_file: Path | None) -> None:
    """The tools the mode needs on this machine (only to make the image when it is not converted yet)."""
    need_convert = image_file is not None and not image_file.is_file()
    if mode == "charliecloud" and need_convert and shutil.which("mksquashfs") is None:
        raise UsageError(
            'container = "charliecloud" needs mksquashfs here to make the image',
            fix="install squashfs-tools (Debian: apt-get install squashfs-tools), or choose another [slurm] container",
        )
    if mode == "pyxis":
        if "--container-image" not in cmd.run(["srun", "--help"]).out:
            raise UsageError(
                "this Slurm has no pyxis (srun --help lists no --container-image)",
                fix='ask the cluster\'s admins for pyxis and enroot, or set [slurm] container = "docker" or '
                '"charliecloud"',
            )
        if need_convert and shutil.which("enroot") is None:
            raise UsageError(
                'container = "pyxis" needs enroot here to make the image (enroot import dockerd://...)',
                fix="install enroot, or convert the image on a node that has it",
            )


def prepare_image(job: SlurmJob, settings: Settings, reporter: Reporter) -> None:
    """Put the image where the job finds it: a SquashFS on the shared path (charliecloud, pyxis), or the nodes'
    engines (docker, when push_to names them)."""
    if job.mode == "docker":
        if settings.slurm.push_to:
            push(job.image.ref, settings.slurm.push_to, reporter)
        return
    dest = Path(job.image_path)
    if dest.is_file():
        reporter.done(f"{dest} is already made from {job.image.id[:19]} (cached by image id)")
        return
    from nodekit.backends.slurm.convert import convert

    reporter.step(f"converting {job.image.ref} into {dest}")
    seconds = convert(job.image.ref, dest, job.mode, mount_targets(settings), job.image.env)
    reporter.done(f"{dest} made in {seconds:.0f} s")


def push(ref: str, endpoints: tuple[str, ...], reporter: Reporter) -> None:
    from nodekit import ship

    src = ship.source_of(ref, None)
    targets = [ship.Target(name=e, endpoint=e) for e in endpoints]
    with ship.SharedSsh():
        plan = ship.plan_push(src, ship.survey(src, targets), here_zstd=ship.zstd_here())
        if all(s.action == "skip" for s in plan.steps):
            reporter.done(f"{ref} is already on every push_to engine")
            return
        reporter.step(f"pushing {ref} to {', '.join(endpoints)}")
        ship.push(plan, reporter)
    reporter.done(f"{ref} is on every push_to engine (image id verified)")


def write(prepared: Prepared) -> Path:
    """The script (0600: it carries the job secret, which lets a process join the job's preflight store), and the
    outputs directory, where Slurm opens the job's log before the script's first line runs."""
    Path(prepared.job.output_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(prepared.path, prepared.script, mode=0o600, within=prepared.project_dir)
    return prepared.path


def submit(path: Path) -> str:
    found = cmd.run(["sbatch", "--parsable", str(path)])
    if found.code != 0:
        raise UsageError(f"sbatch refuses the job: {found.message}", fix=f"check {path}'s #SBATCH lines")
    return found.out.strip().split(";", 1)[0]


def run_job(
    path: Path,
    reporter: Reporter,
    on_line: follow.LineFn,
    *,
    sleep: Callable[[float], None] | None = None,
    nnodes: int = 1,
    events: RunEvents = NO_EVENTS,
) -> int:
    """Submit the script and follow the job to its end; the job's exit code. Ctrl-C/SIGTERM/SIGHUP cancel it.
    ``events`` hears the job id, its hosts, when its ``nnodes`` ranks started (Slurm: RUNNING) and ended."""
    job_id = submit(path)
    reporter.done(f"submitted job {job_id} ({path})")
    events.placed(job_id, [])
    for rank in range(nnodes):
        events.phase(rank, "image")  # converted or pushed before the submission

    def on_state(info: follow.JobInfo) -> None:
        where = f" on {info.nodes}" if info.nodes and info.nodes != "(null)" else ""
        why = f" ({info.reason})" if info.reason not in ("", "None") else ""
        reporter.step(f"job {job_id}: {info.state}{where}{why}")
        if info.state == "RUNNING" or info.done:
            events.placed(job_id, list(enumerate(follow.hostnames(info.nodes)))[:nnodes])
            for rank in range(nnodes):
                events.phase(rank, "started" if info.state == "RUNNING" else "end")

    kw = {"sleep": sleep} if sleep else {}
    try:
        with follow.stop_signals():
            info = follow.follow(job_id, on_state, on_line, **kw)  # type: ignore[arg-type]
    except follow.Stopped as e:
        reporter.warn(f"stopping: scancel {job_id}")
        follow.cancel(job_id)
        follow.follow(job_id, on_state, on_line, deadline_s=follow.CANCEL_WAIT_S, **kw)  # type: ignore[arg-type]
        return 128 + e.signum
    code = follow.exit_code(info)
    if code != 0:
        raise JobFailed(
            f"Slurm job {job_id} ended {info.state} with exit code {code}",
            exit_code=code,
            fix=f"the whole log: {info.log or 'its --output file'}; scontrol show job {job_id}",
        )
    reporter.done(f"job {job_id} {info.state} (exit code 0)")
    return 0
