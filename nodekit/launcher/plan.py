"""Pure decisions: what to exec, with which environment, and the one line each node prints at start.

Nothing here imports torch or touches the process; ``main`` carries the decisions out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodekit.launcher.config import LaunchConfig

# In ``env`` mode the framework (Lightning, LightlyTrain) starts its own per-device workers. Lightning's
# LightningEnvironment treats a set LOCAL_RANK as "an external launcher already started every process" and then
# starts none (one process per node joins a world that expects nnodes x devices: a hang), and with RANK,
# GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE all set it picks TorchElasticEnvironment instead. A stale value
# (e.g. from a base image or a user's env table) must not leak in, so these are removed.
ENV_MODE_UNSET = ("LOCAL_RANK", "RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


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


def exec_plan(
    cfg: LaunchConfig,
    command: Command,
    *,
    python: str = "python",
    torchrun: str = "torchrun",
    cpus: int = 1,
    local_rank: str = "--local-rank",
) -> ExecPlan:
    """The process this node's launcher becomes.

    ``torchrun`` mode: static rendezvous on MASTER_ADDR:MASTER_PORT, node 0 hosting it. ``--rdzv-conf timeout``
    bounds torchrun's own wait for the other nodes (torch's default is 600 s) so that with preflight off, or on a
    restart round, a missing node still ends the job instead of hanging it. ``env`` mode: ``python`` runs the
    command itself with MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, NPROC_PER_NODE (and WORLD_SIZE when known)
    already in the environment, and without the per-process variables listed in :data:`ENV_MODE_UNSET`.
    Both set NODEKIT_EXIT_GUARD for the job's processes (1 unless the node's environment said 0), which makes every
    Python process of the job load :mod:`nodekit.launcher.exitguard`.

    ``fabric`` mode is torchrun plus :func:`fabric_env`, and OMP_NUM_THREADS defaulting to ``cpus`` as ``fabric
    run`` does. ``torch.distributed.launch`` mode is torchrun with ``<local_rank>=${local_rank}`` appended to the
    script's arguments: torch's agent substitutes each worker's local rank there, as the legacy launcher did.
    """
    guard = (("NODEKIT_EXIT_GUARD", "1" if cfg.exit_guard else "0"),)
    if cfg.mode == "env":
        return ExecPlan(argv=(python, *command.argv()), set_env=guard, unset_env=ENV_MODE_UNSET)
    target = command.argv()
    if cfg.mode == "torch.distributed.launch":
        if local_rank not in _LOCAL_RANK_FLAGS:
            raise ValueError(f"local_rank must be one of {_LOCAL_RANK_FLAGS}")
        target.append(f"{local_rank}=${{local_rank}}")
    argv = [
        torchrun,
        "--nnodes", str(cfg.nnodes),
        "--node-rank", str(cfg.node_rank),
        "--nproc-per-node", str(cfg.nproc_per_node),
        "--master-addr", cfg.master_addr,
        "--master-port", str(cfg.master_port),
        "--max-restarts", str(cfg.max_restarts),
        "--rdzv-conf", f"timeout={max(1, round(cfg.rdzv_timeout))}",
        *target,
    ]  # fmt: skip
    if cfg.mode == "fabric":
        return ExecPlan(
            argv=tuple(argv), set_env=guard + fabric_env(cfg), default_env=(("OMP_NUM_THREADS", str(max(1, cpus))),)
        )
    return ExecPlan(argv=tuple(argv), set_env=guard)


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
    world = str(cfg.world_size) if cfg.world_size is not None else "?"
    image = cfg.fingerprint[:12] if cfg.fingerprint else "unknown"
    name = f" {cfg.name}" if cfg.name else ""
    return (
        f"nodekit{name}: node {cfg.node_rank}/{cfg.nnodes} | {cfg.nproc_per_node} proc/node | world {world} | "
        f"main {cfg.master_addr}:{cfg.master_port} | iface {cfg.iface or 'auto'} | image {image} | {cfg.mode}"
    )
