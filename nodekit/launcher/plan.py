"""Pure decisions: what to exec, with which environment, and the one line each node prints at start.

Nothing here imports torch or touches the process; ``main`` carries the decisions out.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from nodekit.launcher.config import LaunchConfig
from nodekit.launcher.contract import Env, LaunchMode

# In ``env`` mode the framework (Lightning, LightlyTrain) starts its own per-device workers. Lightning's
# LightningEnvironment treats a set LOCAL_RANK as "an external launcher already started every process" and then
# starts none (one process per node joins a world that expects nnodes x devices: a hang), and with RANK,
# GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE all set it picks TorchElasticEnvironment instead. A stale value
# (e.g. from a base image or a user's env table) must not leak in, so these are removed.
ENV_MODE_UNSET = (Env.LOCAL_RANK, Env.RANK, Env.GROUP_RANK, Env.LOCAL_WORLD_SIZE)


class CommandError(ValueError):
    """The training command (argv after ``-m nodekit.launcher``) is empty or names nothing that exists."""


@dataclass(frozen=True)
class Command:
    """The user's training command: a script, or ``-m module``, and its arguments."""

    script: str | None
    module: str | None
    args: tuple[str, ...]

    def argv(self) -> list[str]:
        """What follows ``python`` (or torchrun's own options): ``script args`` or ``-m module args``."""
        head = ["-m", str(self.module)] if self.module is not None else [str(self.script)]
        return [*head, *self.args]


@dataclass(frozen=True)
class ExecPlan:
    """A complete description of the exec: argv, variables to set and variables to remove."""

    argv: tuple[str, ...]
    set_env: tuple[tuple[str, str], ...] = ()
    unset_env: tuple[str, ...] = ()
    default_env: tuple[tuple[str, str], ...] = ()  # set only where ``base`` lacks them
    per_process: tuple[tuple[tuple[str, str], ...], ...] = ()
    """:attr:`Runs.CHILDREN`: the launcher starts one process per entry, each with these variables too
    (``ranks.py``)."""
    first_rank: int = 0
    """:attr:`Runs.CHILDREN`: the global rank of the first entry's process, so that a failure names its rank."""

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with this plan's changes applied."""
        env = {k: v for k, v in base.items() if k not in self.unset_env}
        env.update(self.set_env)
        for k, v in self.default_env:
            env.setdefault(k, v)
        return env


def parse_command(argv: Sequence[str]) -> Command:
    """``train.py a b`` or ``-m pkg.mod a b``; anything else is a :class:`CommandError`."""
    if not argv:
        raise CommandError(
            "no training command: expected `python -m nodekit.launcher train.py [args]` or `... -m pkg.module [args]`"
        )
    if argv[0] in ("-m", "--module"):
        if len(argv) < 2 or not argv[1] or argv[1].startswith("-"):
            raise CommandError(f"{argv[0]} needs a module name, e.g. `-m pkg.train`")
        return Command(script=None, module=argv[1], args=tuple(argv[2:]))
    if argv[0].startswith("-"):
        raise CommandError(f"unexpected option {argv[0]!r} before the training script (only -m is understood)")
    return Command(script=argv[0], module=None, args=tuple(argv[1:]))


def fabric_env(cfg: LaunchConfig) -> tuple[tuple[str, str], ...]:
    """What Lightning's ``fabric run`` sets before it calls torchrun (lightning/fabric/cli.py, _set_env_variables),
    for ``--accelerator --strategy --devices <this node's processes> --num-nodes --precision``: Fabric() reads these
    when the script leaves its own arguments at their defaults."""
    env = [
        ("LT_CLI_USED", "1"),
        ("LT_ACCELERATOR", cfg.accelerator),
        ("LT_STRATEGY", cfg.strategy),
        ("LT_DEVICES", str(cfg.nproc_per_node)),
        ("LT_NUM_NODES", str(cfg.nnodes)),
    ]
    if cfg.precision is not None:
        env.append(("LT_PRECISION", cfg.precision))
    return tuple(env)


_LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")


def local_rank_flag(source: str | None) -> str:
    """The spelling of the local-rank option a ``torch.distributed.launch``-style script defines in ``source``.

    torch >= 2.0 passes ``--local-rank``; scripts written for older torch define only ``--local_rank``, which
    argparse would then refuse. The dashed form wins when both (or neither) appear.
    """
    if source is not None and "--local_rank" in source and "--local-rank" not in source:
        return "--local_rank"
    return "--local-rank"


# With c10d, torch (>= 2.4) lets the workers of every round share one store that the agent of group rank 0 opened in
# the first round. Keys the workers of a failed round left there (a dead worker's address, barrier counts) are read
# by the next round's: gloo then connects to the dead worker ("connectFullMesh failed ... Connection refused") and
# the restarted job fails or hangs (pytorch/pytorch#135712). This makes global rank 0's worker host a new store,
# on a free port, in every round.
FRESH_STORE = (("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),)
C10D_READ_TIMEOUT_S = 60  # torch's own default


@dataclass(frozen=True)
class Rendezvous:
    """What torchrun's c10d rendezvous needs beyond the config: used when ``max_restarts > 0``.

    ``run_id`` is the same on every node and new for every run (main chooses it in preflight and its verdict
    carries it to every node); ``local_addr`` is this node's address toward main, where the workers of every node
    reach this node's store when its agent gets group rank 0 (torchrun would otherwise use the host name, which
    another machine may not resolve, or resolves to 127.0.1.1)."""

    run_id: str
    local_addr: str | None = None


def fallback_run_id(cfg: LaunchConfig) -> str:
    """The rendezvous id without preflight, when no node can learn a fresh one from main: the job's name and port.
    Still one rendezvous per run, since node 0's torchrun hosts a new store every time it starts."""
    return f"nodekit-{cfg.name or 'job'}-{cfg.master_port}"


def rendezvous_argv(cfg: LaunchConfig, rdzv: Rendezvous | None) -> list[str]:
    """torchrun's rendezvous options (after ``--nproc-per-node``; static also takes ``--node-rank`` before it).

    ``max_restarts = 0``: static rendezvous on MASTER_ADDR:MASTER_PORT, node 0 hosting it, group rank = node rank.
    ``max_restarts > 0``: c10d on the same endpoint, node 0 hosting its store (``is_host``, never guessed from the
    address: on one machine every node's address matches), and a fresh store for the workers of every round
    (:data:`FRESH_STORE`). Only c10d restarts every node's workers when one node's agent restarts its own: the others
    see a node waiting for the next round (``num_nodes_waiting``) and join it. With static rendezvous each agent
    restarts alone (its ``num_nodes_waiting`` is always 0), so the others restart only if their own workers happen
    to fail, and the restarted workers meet in the agent's store among the keys of the round before. Group ranks are
    then torchrun's choice (ordered by address), not nodekit's node rank.

    The wait for every node keeps its bound, NODEKIT_RDZV_TIMEOUT: ``timeout`` for static (torch's default is 600 s),
    ``join_timeout`` for c10d. c10d's ``read_timeout`` bounds every call to node 0's store, the first connection
    included: torch's 60 s after a preflight (main is known to be up; a longer bound would only delay the watchdog's
    stop while main's host has vanished without closing its connections, since torchrun asks the store every 0.1 s),
    NODEKIT_RDZV_TIMEOUT without one (a node may then start long before main).
    """
    timeout = max(1, round(cfg.rdzv_timeout))
    if cfg.max_restarts == 0:
        return [
            "--master-addr", cfg.master_addr, "--master-port", str(cfg.master_port), "--max-restarts", "0",
            "--rdzv-conf", f"timeout={timeout}",
        ]  # fmt: skip
    rdzv = rdzv or Rendezvous(run_id=fallback_run_id(cfg))
    read = min(timeout, C10D_READ_TIMEOUT_S) if cfg.preflight else timeout
    host = f"[{cfg.master_addr}]" if ":" in cfg.master_addr else cfg.master_addr
    argv = [
        "--max-restarts", str(cfg.max_restarts), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{host}:{cfg.master_port}", "--rdzv-id", rdzv.run_id,
        "--rdzv-conf", f"join_timeout={timeout},read_timeout={read},is_host={1 if cfg.is_main else 0}",
    ]  # fmt: skip
    if rdzv.local_addr:
        argv += ["--local-addr", rdzv.local_addr]
    return argv


@dataclass(frozen=True)
class Tools:
    """What this node gives a style, found by ``main.py`` (the plan stays pure): the programs, the CPUs, the
    local-rank spelling the script takes (:func:`local_rank_flag`) and torchrun's c10d rendezvous when workers may
    restart."""

    python: str = "python"
    torchrun: str = "torchrun"
    cpus: int = 1
    local_rank: str = "--local-rank"
    rendezvous: Rendezvous | None = None
    counts: Mapping[int, int] | None = None
    """Every node's processes, from the preflight's facts (mpirun lays its ranks out by them)."""


class Runs(enum.Enum):
    """How a style's plan is carried out: the one choice that decides what the launcher does after the checks."""

    TORCHRUN = "torchrun"
    """torchrun starts the workers: after a preflight it runs in the launcher's own process (``torchrun.py``), under
    the peer watchdog and the stall watch, and restarts with c10d (``max_restarts``)."""
    CHILDREN = "children"
    """The launcher starts one child per :attr:`ExecPlan.per_process` entry and watches them (``ranks.py``): the
    first to fail is named and stops the others, under the peer watchdog and the stall watch; nothing restarts
    them."""
    EXEC = "exec"
    """The launcher execs the plan's argv and is gone: no watchdog, no store on node 0 after the checks, no link
    check beside the job's start; the framework starts its own workers (``env``)."""

    @property
    def stays(self) -> bool:
        """The launcher stays for the whole job: only then does node 0 host the store, the peer watchdog run and the
        link check run beside the job's start."""
        return self is not Runs.EXEC


@dataclass(frozen=True)
class Style:
    """One launch style: its plan (the argv and environment, and for :attr:`Runs.CHILDREN` one entry per process;
    NODEKIT_EXIT_GUARD is added for every style), how that plan runs (:class:`Runs`), and whether ``main.py`` must
    read the training script's source for :attr:`Tools.local_rank` (``reads_script``: what the plan needs, not how
    it runs)."""

    plan: Callable[[LaunchConfig, Command, Tools], ExecPlan]
    runs: Runs = Runs.TORCHRUN
    reads_script: bool = False
    says: str = ""
    """Which scripts it is for, in a few words: the settings' description of ``launcher`` (and so the config
    reference and the starter nodekit.toml) lists every style with these words, from :data:`STYLES`."""


def _torchrun_argv(cfg: LaunchConfig, target: Sequence[str], tools: Tools) -> tuple[str, ...]:
    static = ["--node-rank", str(cfg.node_rank)] if cfg.max_restarts == 0 else []
    return (
        tools.torchrun, "--nnodes", str(cfg.nnodes), *static, "--nproc-per-node", str(cfg.nproc_per_node),
        *rendezvous_argv(cfg, tools.rendezvous), *target,
    )  # fmt: skip


def _fresh_store(cfg: LaunchConfig) -> tuple[tuple[str, str], ...]:
    return FRESH_STORE if cfg.max_restarts > 0 else ()


def _torchrun(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    """torchrun with :func:`rendezvous_argv` (static, or c10d when workers may restart)."""
    return ExecPlan(argv=_torchrun_argv(cfg, command.argv(), tools), set_env=_fresh_store(cfg))


def _fabric(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    """torchrun plus :func:`fabric_env`, and OMP_NUM_THREADS defaulting to the CPUs as ``fabric run`` does."""
    return ExecPlan(
        argv=_torchrun_argv(cfg, command.argv(), tools),
        set_env=_fresh_store(cfg) + fabric_env(cfg),
        default_env=(("OMP_NUM_THREADS", str(max(1, tools.cpus))),),
    )


def _env(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    """``python`` runs the command itself, without the per-process variables of :data:`ENV_MODE_UNSET`."""
    return ExecPlan(argv=(tools.python, *command.argv()), unset_env=ENV_MODE_UNSET)


def _distributed_launch(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    """torchrun with ``<local_rank>=${local_rank}`` appended to the script's arguments: torch's agent substitutes
    each worker's local rank there, as the legacy launcher did."""
    if tools.local_rank not in _LOCAL_RANK_FLAGS:
        raise ValueError(f"local_rank must be one of {_LOCAL_RANK_FLAGS}")
    target = [*command.argv(), f"{tools.local_rank}=${{local_rank}}"]
    return ExecPlan(argv=_torchrun_argv(cfg, target, tools), set_env=_fresh_store(cfg))


def slots(cfg: LaunchConfig, counts: Mapping[int, int] | None = None) -> tuple[int, int]:
    """``(first global rank on this node, world size)`` as ``mpirun -map-by slot`` lays ranks out: node 0's
    processes first, then node 1's. ``counts``: every node's processes (the preflight's facts); without them, the
    declared counts when every node's is a number, else this node's count on every node."""
    known = dict(counts or {})
    if len(known) < cfg.nnodes:
        declared = dict(cfg.nproc_declared)
        if all(declared.get(r, "").isdigit() for r in range(cfg.nnodes)):
            known = {r: int(declared[r]) for r in range(cfg.nnodes)}
        else:
            known = dict.fromkeys(range(cfg.nnodes), cfg.nproc_per_node)
    known[cfg.node_rank] = cfg.nproc_per_node
    return sum(known[r] for r in range(cfg.node_rank)), sum(known[r] for r in range(cfg.nnodes))


def mpirun_env(cfg: LaunchConfig, first: int, world: int) -> tuple[tuple[tuple[str, str], ...], ...]:
    """What Open MPI's mpirun gives each of this node's processes (OMPI_COMM_WORLD_*), per local rank."""
    return tuple(
        (
            ("OMPI_COMM_WORLD_RANK", str(first + local)),
            ("OMPI_COMM_WORLD_SIZE", str(world)),
            ("OMPI_COMM_WORLD_LOCAL_RANK", str(local)),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", str(cfg.nproc_per_node)),
            ("OMPI_COMM_WORLD_NODE_RANK", str(cfg.node_rank)),
            ("OMPI_UNIVERSE_SIZE", str(world)),
        )
        for local in range(cfg.nproc_per_node)
    )


def _mpirun(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    """``nproc_per_node`` processes of ``python`` running the command, each with the variables Open MPI's mpirun
    sets (:func:`mpirun_env`), ranks laid out as ``-map-by slot`` (:func:`slots`); MASTER_ADDR and MASTER_PORT are
    in the environment already, as the guides pass them with ``-x``. The launcher starts and watches them itself
    (``ranks.py``); nothing restarts them."""
    first, world = slots(cfg, tools.counts)
    return ExecPlan(argv=(tools.python, *command.argv()), unset_env=ENV_MODE_UNSET,
                    per_process=mpirun_env(cfg, first, world), first_rank=first)  # fmt: skip


# Every mode of contract.LAUNCH_MODES, and nothing else (tests/unit/launcher/test_contract_names.py holds them equal).
STYLES: dict[str, Style] = {
    LaunchMode.TORCHRUN: Style(_torchrun, says="torchrun starts nproc_per_node workers (the default)"),
    LaunchMode.FABRIC: Style(_fabric, says="what `fabric run` does (settings accelerator, strategy, precision)"),
    LaunchMode.ENV: Style(_env, Runs.EXEC, says="the script once per node, for frameworks that start their own "
                          "workers (Lightning Trainer)"),
    LaunchMode.DISTRIBUTED_LAUNCH: Style(_distributed_launch, reads_script=True,
                                         says="for scripts that take --local-rank/--local_rank"),
    LaunchMode.MPIRUN: Style(_mpirun, Runs.CHILDREN, says="for scripts that read Open MPI's OMPI_COMM_WORLD_* "
                             "variables (no MPI runtime)"),
}  # fmt: skip


def styles_text() -> str:
    """Every style of :data:`STYLES` with its :attr:`Style.says`, in one line: ``torchrun: ...; fabric: ...``."""
    return "; ".join(f"{name}: {s.says}" if s.says else name for name, s in STYLES.items())


def style(mode: str) -> Style:
    """The style of launch mode ``mode`` (parse_env has checked it is one of contract.LAUNCH_MODES)."""
    return STYLES[mode]


def exec_plan(
    cfg: LaunchConfig,
    command: Command,
    *,
    python: str = "python",
    torchrun: str = "torchrun",
    cpus: int = 1,
    local_rank: str = "--local-rank",
    rendezvous: Rendezvous | None = None,
    counts: Mapping[int, int] | None = None,
) -> ExecPlan:
    """What this node's launcher carries out: its mode's :class:`Style` plan, with NODEKIT_EXIT_GUARD set for the
    job's processes (1 unless the node's environment said 0), which makes every Python process of the job load
    :mod:`nodekit.launcher.exitguard`. Each style's function says what its plan is; :data:`STYLES` lists them."""
    tools = Tools(python=python, torchrun=torchrun, cpus=cpus, local_rank=local_rank, rendezvous=rendezvous,
                  counts=counts)  # fmt: skip
    chosen = style(cfg.mode)
    plan = chosen.plan(cfg, command, tools)
    if chosen.runs is Runs.CHILDREN and not plan.per_process:
        raise ValueError(f"launch style {cfg.mode!r} runs children but its plan names none (ExecPlan.per_process)")
    # Every mode: NODEKIT_EXIT_GUARD for the job's processes (1 unless the node's environment said 0), which makes
    # every Python process of the job load nodekit.launcher.exitguard, and NODEKIT_WORKER_DIR, where that hook keeps
    # each process's stack dump and progress (nodekit.launcher.stacks.hook; `nodekit stacks` and the stall watch).
    guard = ((Env.EXIT_GUARD, "1" if cfg.exit_guard else "0"), (Env.WORKER_DIR, cfg.worker_dir))
    return replace(plan, set_env=guard + plan.set_env)


def missing_target(command: Command, workdir: str, exists: Mapping[str, bool] | None = None) -> str | None:
    """A one-line error when the script is not in ``workdir``, else None. Modules are not checked here.

    ``exists`` maps paths to answers for tests; by default the file system is asked.
    """
    if command.script is None:
        return None
    path = command.script if os.path.isabs(command.script) else os.path.join(workdir, command.script)
    found = exists[path] if exists is not None and path in exists else os.path.isfile(path)
    if found:
        return None
    return (
        f"training script {command.script!r} not found in {workdir} (the image copies the project directory "
        f"there: check `script` in nodekit.toml and .dockerignore, then `nodekit build`)"
    )


def start_line(cfg: LaunchConfig) -> str:
    """The single line every node prints first, so a log shows at a glance which node runs what."""
    # A node whose process count is "auto" knows its own count, not the others': the preflight counts the world.
    world = str(cfg.world_size) if cfg.world_size is not None else "counted in preflight"
    image = cfg.fingerprint[:12] if cfg.fingerprint else "unknown"
    name = f" {cfg.name}" if cfg.name else ""
    return (
        f"nodekit{name}: node {cfg.node_rank}/{cfg.nnodes} | {cfg.nproc_per_node} proc/node | world {world} | "
        f"main {cfg.master_addr}:{cfg.master_port} | iface {cfg.iface or 'auto'} | image {image} | {cfg.mode}"
    )
