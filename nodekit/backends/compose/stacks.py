"""Every rank's Python stack, read from the nodes' running containers: ``nodekit stacks``.

Each node's container runs ``python -m nodekit.launcher.stacks`` (``docker exec``, through the node's engine: the
local one for ``nodekit up``, ``ssh://`` for the fleet's hosts), which signals the job's processes there and prints
their dumps as JSON (:mod:`nodekit.launcher.stacks.collect`); the launcher's own grouping
(:mod:`nodekit.launcher.stacks.places`) makes the report, so ``nodekit stacks`` and the stall watch's report read
the same way. Nothing is installed on a node: the reader is in the image, beside the launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from nodekit.backends.compose.node import compose_path, project_for
from nodekit.backends.compose.render import SERVICE
from nodekit.config.settings import Settings
from nodekit.errors import NodekitError, UsageError
from nodekit.launcher.stacks import collect
from nodekit.launcher.stacks.places import RankStack
from nodekit.system import docker

# The image's interpreter (the ENTRYPOINT's): PYTHONPATH=/opt/nodekit, set in the image, finds the reader.
READER = ["/opt/venv/bin/python", "-m", "nodekit.launcher.stacks"]
READ_S = 60.0  # the reader itself gives up after collect.COLLECT_S; the rest is docker exec (and ssh) starting
MAX_PARALLEL = 16
_OLD_IMAGE = "No module named nodekit.launcher.stacks"


@dataclass(frozen=True)
class Target:
    """Node ``rank``'s compose project on an engine (``host`` None: this machine's), and how to name it."""

    rank: int
    project: str
    host: str | None = None
    compose_file: Path | None = None
    where: str = "this host"


@dataclass(frozen=True)
class Stacks:
    """What the nodes answered: every process's stack, the nodes that run no container of the job, and a line (with
    its fix) for each node that could not be read."""

    asked: list[Target] = field(default_factory=list)
    stacks: list[RankStack] = field(default_factory=list)
    absent: list[Target] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def absent_lines(self) -> list[str]:
        return [f"node {t.rank} runs no container of the job on {t.where} ({t.project})" for t in self.absent]

    def nothing_runs(self) -> str | None:
        """The line when no asked node runs a container of the job (None: some do, or some could not be read)."""
        if self.stacks or self.problems or not self.asked:
            return None
        if len(self.asked) == 1:
            return self.absent_lines()[0]
        return f"no node of the job runs a container on {', '.join(dict.fromkeys(t.where for t in self.asked))}"


def read_node(target: Target) -> list[RankStack] | None:
    """One node's processes; None when no container of the job runs there. NodekitError when it cannot be read."""
    done = docker.compose_exec(target.compose_file, target.project, SERVICE, READER, host=target.host, deadline=READ_S)
    if done is None:
        return None
    if done.returncode != 0:
        tail = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        why = tail[-1] if tail else f"exit code {done.returncode}"
        old = _OLD_IMAGE in done.stderr
        raise NodekitError(
            f"cannot read the stacks of node {target.rank} on {target.where}: {why}",
            fix="nodekit build, then start the job again: its image predates nodekit stacks"
            if old
            else f"docker exec into {target.project}'s container on {target.where} and run {' '.join(READER)}",
        )
    try:
        processes = collect.from_json(done.stdout)
    except (ValueError, TypeError, KeyError):
        raise NodekitError(
            f"node {target.rank} on {target.where} answered something other than nodekit's stack format",
            fix="nodekit build, then start the job again, so that the image's launcher matches this nodekit",
        ) from None
    return [RankStack.of(p, target.rank) for p in processes]


def gather(targets: Sequence[Target], read: Callable[[Target], list[RankStack] | None] = read_node) -> Stacks:
    """Every target read in parallel."""

    def one(t: Target) -> tuple[Target, list[RankStack] | None, str | None]:
        try:
            return t, read(t), None
        except NodekitError as e:
            return t, None, e.one_line()

    found = Stacks(asked=list(targets))
    if not targets:
        return found
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as pool:
        for t, stacks, problem in pool.map(one, targets):
            if problem is not None:
                found.problems.append(problem)
            elif stacks is None:
                found.absent.append(t)
            else:
                found.stacks.extend(stacks)
    return found


def local_targets(settings: Settings, node: int | None, out_dir: Path | None = None) -> list[Target]:
    """This host's nodes of the job (``nodekit up``): the one ``node`` names, else every rank."""
    if node is not None and not 0 <= node < settings.nnodes:
        last = settings.nnodes - 1
        raise UsageError(f"--node {node} is not one of 0..{last}", fix=f"--node 0..{last}")
    ranks = [node] if node is not None else list(range(settings.nnodes))
    targets = []
    for r in ranks:
        path = compose_path(settings, r, out_dir)
        targets.append(Target(r, project_for(settings, r), None, path if path.is_file() else None))
    return targets
