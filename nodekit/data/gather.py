"""``nodekit data gather``: every host's output directory (or a sub-path of it) brought back here, in parallel, one
directory per node, verified, with files identical across nodes stored once.

Layout under the destination (default ``gathered/`` in the project)::

    node-0/...              node 0's files, each a hard link into the store
    node-1/...
    .nodekit-gather/objects/<hash>   every content once, named by its hash (a checkpoint all nodes wrote: one copy)
    .nodekit-gather/cache/node-R.json   the hash cache each node's next listing sends (unchanged files not re-read)

Plan, then apply: each node lists its directory (:func:`nodekit.data.outputs.listing`), :func:`plan_node` decides
purely what must travel (contents the store lacks) and what is only linked, then every node's missing contents are
fetched at once and linked into place. A gather cut short (Ctrl-C, a lost link) keeps every content that arrived
whole; the next one fetches only the rest. A file is never visible under its final name half-written (it is linked
from a verified content, through a temporary name and a rename). Nothing is deleted: a file a node no longer has
stays in its node directory. Names from a node are checked before anything is written for it, and nothing is written
outside the destination: a node directory (or a parent in it) that is a link is refused.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nodekit.config.settings import Settings
from nodekit.data.outputs import Listing, fetch, listing, object_path
from nodekit.data.transport import DataError, RankedHost, Where, at_once, raise_first
from nodekit.errors import UsageError
from nodekit.job.spec import output_dir_of
from nodekit.launcher.datasync.names import name_problem
from nodekit.launcher.datasync.scan import Cache

STATE = ".nodekit-gather"


@dataclass(frozen=True)
class Source:
    """One node's directory to gather: where it is, and the directory it lands in here."""

    where: Where
    root: str
    label: str  # node-R

    @property
    def shown(self) -> str:
        return f"{self.where.name}:{self.root}"


@dataclass(frozen=True)
class NodePlan:
    source: Source
    files: Mapping[str, tuple[int, str]]
    fetch: Mapping[str, tuple[int, str]]  # one name per content the store lacks
    skipped: tuple[str, ...] = ()
    cache: Cache = field(default_factory=dict)  # what the node's next listing sends

    @property
    def fetch_bytes(self) -> int:
        return sum(s for s, _ in self.fetch.values())


def plan_node(source: Source, found: Listing, held: set[str], claimed: set[str]) -> NodePlan:
    """Pure: the contents to fetch from this node (those neither in the store, ``held``, nor fetched from another
    node, ``claimed``, which this adds to), every name it links."""
    fetch_: dict[str, tuple[int, str]] = {}
    for name, (size, h) in found.files.items():
        if h not in held and h not in claimed:
            claimed.add(h)
            fetch_[name] = (size, h)
    return NodePlan(source, found.files, fetch_, found.skipped, found.cache)


def dry_run_text(plans: Sequence[NodePlan], dest: Path) -> str:
    lines = []
    for p in plans:
        lines.append(f"{p.source.shown} -> {dest / p.source.label}: {len(p.files)} file(s), fetch {len(p.fetch)} "
                     f"({p.fetch_bytes} bytes), the rest already here or from another node")  # fmt: skip
        lines.extend(f"  skipped: {s}" for s in p.skipped[:5])
    lines.append(f"would fetch {sum(p.fetch_bytes for p in plans)} bytes in all")
    return "\n".join(lines)


def _safe_dir(dest: Path, rel: str) -> Path:
    """``dest/rel``'s directory, made, every component checked not to be a link (nothing is written outside)."""
    d = dest
    for part in rel.split("/"):
        d = d / part
        try:
            st = d.lstat()
        except FileNotFoundError:
            d.mkdir()
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise DataError(f"{d} is a link or a file, where gather needs a directory",
                            fix="move it away, or gather --into another directory")  # fmt: skip
    return d


def place(dest: Path, label: str, files: Mapping[str, tuple[int, str]], store: Path) -> int:
    """Link each name whose content the store holds into ``dest/label``; the number placed."""
    placed = 0
    base = _safe_dir(dest, label)
    for name, (_, h) in files.items():
        obj = object_path(store, h)
        if not obj.exists():
            continue
        parent, _, leaf = name.rpartition("/")
        d = _safe_dir(base, parent) if parent else base
        target = d / leaf
        try:
            st = target.lstat()
            if stat.S_ISREG(st.st_mode) and os.path.samefile(target, obj):
                placed += 1
                continue
            if stat.S_ISDIR(st.st_mode):
                raise DataError(f"{target} is a directory, where node's file {name} goes",
                                fix="move it away, or gather --into another directory")  # fmt: skip
        except FileNotFoundError:
            pass
        tmp = d / f".{leaf}.nodekit-gather"
        tmp.unlink(missing_ok=True)
        os.link(obj, tmp)
        os.replace(tmp, target)  # a link at target is replaced, never followed
        placed += 1
    return placed


def _cache_path(dest: Path, label: str) -> Path:
    return dest / STATE / "cache" / f"{label}.json"


def _load_cache(path: Path) -> Cache:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(path: Path, cache: Cache) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, separators=(",", ":")))
    tmp.replace(path)


@dataclass(frozen=True)
class Gathered:
    plan: NodePlan
    placed: int
    missed: tuple[str, ...] = ()


def plan_all(sources: Sequence[Source], dest: Path, exclude: Sequence[str] = ()) -> list[NodePlan]:
    """Every node listed at once, then planned in rank order (the first node holding a content fetches it)."""
    listings = at_once(lambda s: listing(s.where, s.root, _load_cache(_cache_path(dest, s.label)), exclude), sources)
    raise_first(listings, "node(s)")
    store = dest / STATE / "objects"
    held = (
        {p.name.replace("_", ":") for p in store.iterdir() if not p.name.startswith(".")} if store.is_dir() else set()
    )
    claimed: set[str] = set()
    plans = []
    for s, found in zip(sources, listings, strict=True):
        assert isinstance(found, Listing)
        plans.append(plan_node(s, found, held, claimed))
    return plans


def gather(plans: Sequence[NodePlan], dest: Path) -> list[Gathered]:
    """Fetch every node's missing contents at once, then link every node's names into place. DataError naming the
    first node that failed (the others' contents stay in the store for the next run)."""
    store = dest / STATE / "objects"
    store.mkdir(parents=True, exist_ok=True)

    def one(p: NodePlan) -> tuple[str, ...]:
        _save_cache(_cache_path(dest, p.source.label), dict(p.cache))
        _, missed = fetch(p.source.where, p.source.root, p.fetch, store)
        return tuple(missed)

    results = at_once(one, list(plans))
    raise_first(results, "node(s)")
    out = []
    for p, missed in zip(plans, results, strict=True):
        assert isinstance(missed, tuple)
        out.append(Gathered(p, place(dest, p.source.label, p.files, store), missed))
    return out


def report_line(done: Sequence[Gathered], dest: Path) -> str:
    files = sum(d.placed for d in done)
    fetched = sum(d.plan.fetch_bytes for d in done)
    missed = sum(len(d.missed) for d in done)
    tail = f"; {missed} changed on the node while read, not gathered: run it again" if missed else ""
    return f"gathered {files} file(s) from {len(done)} node(s) into {dest} (fetched {fetched} bytes){tail}"


def sources_of(settings: Settings, hosts: Sequence[RankedHost], sub: str | None, cwd: Path) -> list[Source]:
    """Each host's output directory (``[nodes.R] output_dir`` where set), or ``sub`` under it; UsageError (exit 2)
    for a ``sub`` that is not a plain relative path inside it."""
    from nodekit.data.push import where_of

    if sub is not None and (problem := name_problem(sub.strip("/"))) is not None:
        raise UsageError(f"--path {sub!r}: {problem}", fix="--path checkpoints (a directory inside output_dir)")
    out = []
    for h in hosts:
        root = output_dir_of(settings, h.rank, cwd)
        out.append(Source(where_of(h), str(root / sub.strip("/")) if sub else str(root), f"node-{h.rank}"))
    return out
