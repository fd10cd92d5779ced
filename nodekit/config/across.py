"""The settings' checks that read more than one field (a model validator of :class:`~nodekit.config.settings.Settings`
runs :func:`check`): node ranks against the node count, mount targets, Fabric's own settings, plain text in every
value, and the env tables. Each refusal is a :class:`~nodekit.config.tables.Bad` with its fix and the key it
names."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from nodekit.config import inputs
from nodekit.config.tables import Bad, Mount, NodeOverride
from nodekit.launcher.contract import Env, LaunchMode


class Checked(Protocol):
    """The fields these checks read, as :class:`nodekit.config.settings.Settings` (which runs them) has them: named
    here so that this module, which settings.py imports, needs nothing of it."""

    @property
    def nnodes(self) -> int: ...
    @property
    def hosts(self) -> Sequence[str]: ...
    @property
    def nodes(self) -> Mapping[int, NodeOverride]: ...
    @property
    def min_nodes(self) -> int | None: ...
    @property
    def mounts(self) -> Sequence[Mount]: ...
    @property
    def launcher(self) -> str: ...
    @property
    def accelerator(self) -> str | None: ...
    @property
    def strategy(self) -> str | None: ...
    @property
    def precision(self) -> str | None: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def pass_env(self) -> Sequence[str]: ...
    @property
    def model_fields_set(self) -> set[str]: ...


FABRIC_SETTINGS = ("accelerator", "strategy", "precision")
# Variables the launcher and torchrun own: a user value would silently break the rendezvous or the stack check.
_RESERVED_ENV = frozenset(
    {Env.WORLD_SIZE, Env.NODE_RANK, Env.NNODES, Env.NPROC_PER_NODE, Env.RANK, Env.LOCAL_RANK, Env.GROUP_RANK,
     Env.LOCAL_WORLD_SIZE}
)  # fmt: skip
# nodekit variables that are the user's switches, documented for the env table.
_USER_SWITCHES = frozenset({Env.EXIT_GUARD})


def reserved_env(key: str) -> bool:
    """Whether ``key`` is one of nodekit's own variables, which the ``env`` table may not set."""
    if key in _USER_SWITCHES:
        return False
    return key.startswith(("NODEKIT_", "MASTER_")) or key in _RESERVED_ENV


def node_rank_problem(rank: int, nnodes: int) -> str:
    return f"[nodes.{rank}] is outside node ranks 0..{nnodes - 1} (nnodes = {nnodes})"


def check(s: Checked, fields: Collection[str]) -> None:
    """Every check across fields, in the order a user meets them; the first refusal is raised. ``fields``: the names
    of every field of ``s``, whose values must all be plain text."""
    _node_ranks(s)
    _mount_targets(s)
    _fabric_only(s)
    _plain_text(s, fields)
    _env_tables(s)


def _node_ranks(s: Checked) -> None:
    # Without nnodes, `hosts` counts the nodes; with neither (a hostfile given to `nodekit run`, or `up` on
    # one node) the upper bound is checked once the count is known (nodekit/backends/fleet/hosts.py hosts_of).
    count = s.nnodes if "nnodes" in s.model_fields_set else len(s.hosts) or None
    outside = sorted(r for r in s.nodes if r < 0 or (count is not None and r >= count))
    if outside:
        raise Bad(node_rank_problem(outside[0], count or 1), fix=f"remove [nodes.{outside[0]}], or raise nnodes",
                  key="nodes")  # fmt: skip
    if s.min_nodes is not None and s.min_nodes > s.nnodes and "nnodes" in s.model_fields_set:
        raise Bad(
            f"min_nodes = {s.min_nodes} is more than nnodes = {s.nnodes}",
            fix=f"min_nodes <= {s.nnodes}",
            key="min_nodes",
        )


def _mount_targets(s: Checked) -> None:
    targets = [m.container for m in s.mounts]
    twice = next((t for t in targets if targets.count(t) > 1), None)
    if twice is not None:
        raise Bad(
            f"mount target {twice!r} is used twice",
            fix="give each [[mounts]] entry its own container path",
            key="mounts",
        )
    for r, o in s.nodes.items():
        unknown = next((t for t in o.mounts if t not in targets), None)
        if unknown is not None:
            raise Bad(
                f"[nodes.{r}] mounts {unknown!r}, which no [[mounts]] entry mounts",
                fix=f'add a [[mounts]] entry with container = "{unknown}", or remove it from [nodes.{r}] mounts',
                key=f"nodes.{r}.mounts",
            )


def _fabric_only(s: Checked) -> None:
    given = [k for k in FABRIC_SETTINGS if getattr(s, k) is not None]
    if given and s.launcher != LaunchMode.FABRIC:
        raise Bad(
            f'{", ".join(given)} only apply to launcher = "{LaunchMode.FABRIC}" (launcher is {s.launcher!r})',
            fix=f'remove {", ".join(given)}, or set launcher = "{LaunchMode.FABRIC}"',
            key=given[0],
        )


def _plain_text(s: Checked, fields: Collection[str]) -> None:
    """No value may hold what cannot reach a file, an argv or an environment intact. ``args`` and ``env``
    values may span lines (a prompt, a JSON blob); names, paths, URLs and packages may not."""
    for name in fields:
        if name == "project_dir":
            continue
        for where, text in inputs.strings(getattr(s, name), name):
            lines = name == "args" or (name == "env" and where != "env")
            problem = inputs.text_problem(text, lines=lines)
            if problem is None and lines and inputs.too_long(text):
                problem = f"is longer than the {inputs.MAX_ARG_BYTES + 1} bytes Linux allows one argument or variable"
            if problem is not None:
                raise Bad(f"{text[:40]!r} {problem}", fix=f"write {name} without it", key=where)


def _env_tables(s: Checked) -> None:
    for key in (*s.env, *s.pass_env):
        problem = inputs.env_name_problem(key)
        where = "env" if key in s.env else "pass_env"
        if problem is not None:
            raise Bad(problem, fix=f"rename it in {where}, e.g. MY_SETTING", key=where)
        if reserved_env(key):
            raise Bad(
                f"{key} is set by nodekit itself (NODEKIT_*, MASTER_*, ranks and sizes)",
                fix=f"remove {key} from {where}; use the matching setting or flag instead",
                key=where,
            )
    both = next((k for k in s.pass_env if k in s.env), None)
    if both is not None:
        raise Bad(
            f"{both} is in both env (a value written to the file) and pass_env (taken from the shell)",
            fix=f"keep {both} in one of them",
            key="pass_env",
        )
