"""The typer app, shared options, and the error mapping every command goes through."""

from __future__ import annotations

import errno
import functools
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from nodekit import __version__
from nodekit.config import backends

if TYPE_CHECKING:  # the modules are imported lazily, where they are used: `nodekit --help` answers at once
    from nodekit.cli.ui import JobLog, RichReporter
    from nodekit.config.settings import Settings

# The command modules in the order a user meets their commands: set up, build, ship, check; then each backend's, as
# registered (one node, every node, Slurm, Kubernetes: nodekit/config/backends.py); then watch and look back.
# `--help` lists each module's commands in the order the module defines them, so a new command needs no list of its
# own (tests/unit/cli/test_command_order.py holds every command module here).
BEFORE_BACKENDS = ("project", "images", "ship", "data", "doctor")
AFTER_BACKENDS = ("live", "stacks", "runs")
TOPICS = (*BEFORE_BACKENDS, *backends.topics(), *AFTER_BACKENDS)


def command_order(commands: Mapping[str, Any]) -> list[str]:
    """The names of ``commands`` (name -> click command, in the order they were registered) by topic module, then
    by registration."""

    def topic(name: str) -> int:
        module = getattr(commands[name].callback, "__module__", "").rpartition(".")[2]
        return TOPICS.index(module) if module in TOPICS else len(TOPICS)

    return sorted(commands, key=topic)  # sorted is stable: registration order within a module


class _OrderedGroup(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        return command_order(self.commands)


app = typer.Typer(
    name="nodekit",
    cls=_OrderedGroup,
    help="Multi-node PyTorch on plain machines: one pinned image, one compose file per node.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="nodekit.toml to use (default: ./nodekit.toml, NODEKIT_CONFIG)")
]
RankOpt = Annotated[int, typer.Option("--node-rank", "-r", help="this node's rank, 0 is main")]
MainOpt = Annotated[
    str | None,
    typer.Option(
        "--main",
        "-m",
        help="main node's address, as the other nodes reach it (default: main in nodekit.toml; on node 0, this "
        "host's address on its default route)",
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="print the plan, change nothing")]
ImageOpt = Annotated[str | None, typer.Option("--image", help="image to run (default: the last one built here)")]
BuildOpt = Annotated[
    bool, typer.Option("--build", help="build the project's image first (a no-op when it is up to date)")
]
NnodesOpt = Annotated[int | None, typer.Option("--nnodes", help="number of nodes")]
NprocOpt = Annotated[str | None, typer.Option("--nproc-per-node", help="processes per node, or auto")]
PortOpt = Annotated[int | None, typer.Option("--master-port", help="rendezvous port on main")]
ScriptOpt = Annotated[str | None, typer.Option("--script", help="training script, relative to the project")]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="show every line of the build's output, not its summary")
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, TORCH_CPP_LOG_LEVEL=INFO")
]

ScriptArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="the script's arguments, after --: `nodekit up -r 1 -- --epochs 1` (they replace args in nodekit.toml)",
        show_default=False,
        metavar="SCRIPT_ARGS",
    ),
]

# The job's shape over nodekit.toml's: every command that plans the job (compose, up, run, slurm, k8s) takes these,
# and the script's arguments after `--` (torchrun's habit: `torchrun ... train.py --epochs 1`).
JOB_FLAGS = (("nnodes", NnodesOpt), ("nproc_per_node", NprocOpt), ("master_port", PortOpt), ("script", ScriptOpt))
JOB_ARGS = ("args", ScriptArgs)


def job_flags(fn: F) -> F:
    """Give a command declared with ``**job: Any`` the options of :data:`JOB_FLAGS` and the script's arguments after
    ``--`` (:data:`JOB_ARGS`), declared once here: typer reads them in its place (before --dry-run and --config,
    which every command lists last) and the command receives them in ``job``, None where not given, for
    ``load_settings(config, **job)``."""
    params = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    at = next((i for i, p in enumerate(params) if p.name in ("dry_run", "config")), len(params))
    flags = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=a)
        for name, a in (*JOB_FLAGS, JOB_ARGS)
    ]
    ordered = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in [*params[:at], *flags, *params[at:]]]
    setattr(fn, "__signature__", inspect.Signature(ordered, return_annotation=None))  # noqa: B010
    return fn


def handled(fn: F) -> F:
    """Every command runs under :func:`nodekit.system.proc.stopping` (SIGHUP, SIGINT and SIGTERM end what it started and
    exit 128 + the signal); NodekitError becomes its one-line message and exit code, an OSError (a path nodekit
    could not read or write) one line too."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from nodekit.errors import NodekitError
        from nodekit.system import proc

        try:
            _check_image(kwargs.get("image"))
            with proc.stopping():
                return fn(*args, **kwargs)
        except NodekitError as e:
            from nodekit.cli import ui

            ui.error(e.one_line())
            raise typer.Exit(e.exit_code) from None
        except proc.Interrupted as e:
            from nodekit.cli import ui

            # Every child was sent its signal and waited for; one that outlived even SIGKILL (stuck in the kernel)
            # is named rather than said to be ended.
            left = [f"{c.what} (pid {c.pid})" for c in proc.live() if c.poll() is None]
            if left:
                ui.stopped(f"{e.name} received: stopped; still ending: {', '.join(left)}")
            elif behind := proc.left():
                ui.stopped(f"{e.name} received: stopped; may be left running: {'; '.join(behind)}")
            else:
                ui.stopped(f"{e.name} received: stopped, and everything it had started was ended")
            if e.name == "SIGHUP":
                ui.detach_from_terminal()
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError:
            raise  # the reader went away (`nodekit logs | head`): nothing to tell it
        except OSError as e:
            from nodekit.cli import ui

            line, code = os_error(e)
            ui.error(line)
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


def _check_image(image: object) -> None:
    """``--image`` (or an IMAGE argument) of any command: refused in one line before anything is planned, written or
    started when Docker could not take it as a reference (it is copied into compose files, argv and manifests)."""
    if not isinstance(image, str):
        return
    from nodekit.config.inputs import image_ref_problem
    from nodekit.errors import UsageError

    problem = image_ref_problem(image)
    if problem is not None:
        raise UsageError(problem, fix="--image registry.example.com/team/demo:1.0 (or an image id)")


# A path that is wrong or not the user's to write: bad input, like a bad setting. Anything else (a full disk, an
# I/O error) is the machine's trouble: exit 1.
_PATH_ERRNOS = {
    errno.EACCES: "check its permissions, or point the setting that names it elsewhere",
    errno.EPERM: "check its permissions, or point the setting that names it elsewhere",
    errno.EROFS: "it is on a read-only file system: point the setting that names it elsewhere",
    errno.ENOENT: "create its directory, or point the setting that names it elsewhere",
    errno.ENOTDIR: "a file stands where a directory must be: move it away",
    errno.EISDIR: "a directory stands where a file must be: move it away",
    errno.EEXIST: "something else already has that name: move it away",
    errno.ELOOP: "its symbolic links loop: fix or remove them",
    errno.ENAMETOOLONG: "shorten the path",
}


def os_error(e: OSError) -> tuple[str, int]:
    """One line (what, where, the fix) and the exit code for an OSError that reached the command's edge."""
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None) or "a file"
    what = e.strerror or type(e).__name__
    fix = _PATH_ERRNOS.get(e.errno or 0)
    if fix is None:
        return f"{what} ({where}). Fix: check the disk and the path, then run the command again", 1
    return f"{what}: {where}. Fix: {fix}", 2


def load_settings(config: Path | None, **flags: Any) -> Settings:
    from nodekit.config import settings

    if "args" in flags:  # arguments after `--`; none given is not "no arguments", it is "as nodekit.toml says"
        flags["args"] = tuple(flags["args"]) if flags["args"] else None
    if "nproc_per_node" in flags and flags["nproc_per_node"] not in (None, "auto"):
        try:
            flags["nproc_per_node"] = int(flags["nproc_per_node"])
        except ValueError:
            from nodekit.errors import UsageError

            raise UsageError(
                f"--nproc-per-node must be an integer or auto, not {flags['nproc_per_node']!r}",
                fix="--nproc-per-node 8, or --nproc-per-node auto",
            ) from None
    return settings.load(config, **flags)


def reporter(*, verbose: bool | None = None) -> RichReporter:
    """The CLI's reporter: ``verbose`` None shows the tools' every line where no terminal spins; False is the
    summary (steps and their times); True is every line everywhere."""
    from nodekit.cli.ui import RichReporter

    return RichReporter(verbose=verbose)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nodekit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Build once, verify everywhere, launch with one command per node."""


def line_printer(node: int | None) -> JobLog:
    """The job's log printer (:class:`nodekit.cli.ui.JobLog`): every node's lines, or ``node``'s alone."""
    from nodekit.cli.ui import JobLog

    return JobLog(only=node)
