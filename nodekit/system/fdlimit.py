"""This process's open-file limit, raised where a command needs more descriptors than a login starts with.

``nodekit run`` holds two descriptors per node for the whole job (each node's follower: its ``ssh`` client's output
and error pipes), and three more per host while up to ``MAX_PARALLEL`` hosts are checked or started at once, beside
about a hundred of its own: past 1,024 from about 400 nodes on (the head process held 164 at 64 stand-in hosts and
698 at 512, where not every follower was alive at once: benchmarks/scale_bench.py). Most Linux logins start with a
soft limit of 1,024 and a hard one far above it; past the soft one, the next pipe fails with EMFILE in the middle of
a run, with nodes already started. The soft limit is raised up to the hard one (only ever raised: a process may do
that without privileges); where the hard one is too low, the command is refused in one line before anything starts.
The children nodekit starts (ssh, the docker CLI) inherit the raised limit; they poll rather than select, so a high
limit does not break them.
"""

from __future__ import annotations

import resource

from nodekit.errors import UsageError


def wanted(*, soft: int, hard: int, need: int) -> int | None:
    """Pure: the soft limit to set for ``need`` descriptors (None: ``soft`` already allows them); ValueError when
    ``hard`` does not allow them."""
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= need:
        return None
    if hard != inf and hard < need:
        raise ValueError(f"the hard limit {hard} is under {need}")
    return need


def ensure_open_files(need: int, *, what: str = "this command") -> None:
    """Allow this process ``need`` open files: its soft limit raised to that where it is lower, or UsageError (exit 2)
    naming the limit when the hard one does not allow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        to = wanted(soft=soft, hard=hard, need=need)
    except ValueError:
        raise UsageError(
            f"{what} needs about {need} open files, and this shell allows at most {hard} (its hard limit)",
            fix=f"raise it (ulimit -Hn {need} as root, or nofile in /etc/security/limits.conf), then run again",
        ) from None
    if to is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (to, hard))
