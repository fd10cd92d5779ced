"""The resume contract when a host is lost, main's included: the newest copy of every output file reaches the hosts a
restart goes on with, so a script that saves its checkpoint on global rank 0 only still finds it on the new rank 0.

Each host's ``/outputs`` is its own disk: a checkpoint written by rank 0 alone is gone with rank 0's host, and a hand-
off after the loss would have nothing to copy. So while an attempt runs, the head keeps a mirror: every
:data:`MIRROR_S` it lists each host's output directory (the hash cache makes an unchanged file cost a ``stat``) and
fetches the contents it does not hold yet into a content store under ``.nodekit/mirror/`` (one copy per content, over
the head's link). When the supervisor restarts the job without a lost host (``restarts``, ``min_nodes``), the head
lists the hosts left once more and then, before any container starts, puts onto each of them every file it lacks,
in the newest version the head saw anywhere. "Newest" is the order in which the head saw versions appear, never the
hosts' clocks, which need not agree. A file the job wrote on a host is never overwritten there; one the hand-off put
there earlier may be, by a newer version. The mirror runs only when a restart without a host can happen, and
``replicate_outputs = false`` turns it off. Its failure modes are in docs/guides/restarts-and-resume.md.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.config.settings import Settings
from nodekit.data.outputs import fetch, listing, object_path, put
from nodekit.data.transport import DataError
from nodekit.errors import NodekitError
from nodekit.job.spec import output_dir_of
from nodekit.launcher.datasync.scan import Cache, Manifest
from nodekit.system.progress import Reporter

MIRROR_S = 5.0
"""Seconds between two mirror rounds: a checkpoint saved this long before its host is lost may be missed (the one
before it is then the newest the others get)."""
EXCLUDE = ("nodekit",)
"""The launcher's run logs (outputs/nodekit/node-R.log): each node's own, and growing all the time."""

Seen = dict[str, tuple[int, str, int]]
"""name -> (size, hash, when the head first saw this version there: a counter)."""
Put = tuple[str, str, str | None]
"""(name, hash, the hash the node's file must hold to be replaced, or None: the name must be free)."""


def replicating(settings: Settings, hosts: Sequence[FleetHost]) -> bool:
    """Whether a restart could go on without a host, and every host is one the head reaches over SSH (or itself)."""
    droppable = settings.restarts > 0 and settings.min_nodes is not None and settings.min_nodes < len(hosts)
    return settings.replicate_outputs and droppable and all(h.scheme in ("ssh", "unix") for h in hosts)


def follow_hosts(settings: Settings, kept: Sequence[FleetHost]) -> Settings:
    """``settings`` with ``[nodes.R]`` renumbered as the ``kept`` hosts are: each host keeps its own overrides (its
    interface, address, mounts, output directory) when a restart without a lost host renumbers the ranks."""
    nodes = {new: settings.nodes[h.rank] for new, h in enumerate(kept) if h.rank in settings.nodes}
    return settings.model_copy(update={"nodes": nodes})


def newest(seen: Mapping[str, Seen]) -> dict[str, tuple[int, str]]:
    """Pure: per name, the version the head saw appear last on any host."""
    best: dict[str, tuple[int, str, int]] = {}
    for versions in seen.values():
        for name, v in versions.items():
            if name not in best or v[2] > best[name][2]:
                best[name] = v
    return {n: (s, h) for n, (s, h, _) in sorted(best.items())}


def plan_handoff(
    latest: Mapping[str, tuple[int, str]], have: Manifest, placed: Mapping[str, str], held: set[str]
) -> list[Put]:
    """Pure: what one host left gets: every name it lacks, and every name where it holds a version the hand-off put
    there (``placed``) that is not the newest. Its own files are never replaced. Only contents the store ``held``."""
    out: list[Put] = []
    for name, (_, h) in latest.items():
        if h not in held:
            continue
        cur = have.get(name)
        if cur is None:
            out.append((name, h, None))
        elif cur[1] != h and placed.get(name) == cur[1]:
            out.append((name, h, cur[1]))
    return out


class Keeper:
    """The mirror and the hand-off of one ``nodekit run``: entered, it runs a mirror round every :data:`MIRROR_S`
    seconds in a thread of its own, on the hosts of the current attempt (inactive when :func:`replicating` is
    false); left, it stops and removes its store."""

    def __init__(self, settings: Settings, hosts: Sequence[FleetHost], reporter: Reporter) -> None:
        self.active = replicating(settings, hosts)
        self.settings, self.hosts, self.reporter = settings, list(hosts), reporter
        self.dir: Path | None = None
        self.seen: dict[str, Seen] = {}
        self.caches: dict[str, Cache] = {}
        self.placed: dict[str, dict[str, str]] = {}
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> Keeper:
        if self.active:
            parent = self.settings.project_dir / ".nodekit" / "mirror"
            parent.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
            self.store.mkdir()
            threading.Thread(target=self._loop, daemon=True, name="nodekit-mirror").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # a round stuck on a lost host ends at its own deadline; nothing waits for it
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.wait(MIRROR_S):
            with self._lock:
                settings, hosts = self.settings, list(self.hosts)
            self.round(settings, hosts)

    @property
    def store(self) -> Path:
        assert self.dir is not None
        return self.dir / "objects"

    def observe(self, settings: Settings, host: FleetHost) -> Manifest:
        """One round on ``host``: its listing, and every changed file's content fetched; what it holds now."""
        from nodekit.data.push import where_of

        where, root = where_of(host), str(output_dir_of(settings, host.rank, Path.cwd()))
        with self._lock:
            cache, before = self.caches.get(host.url, {}), self.seen.get(host.url, {})
        found = listing(where, root, cache, EXCLUDE)
        changed = {n: v for n, v in found.files.items() if before.get(n, (0, "", 0))[:2] != v}
        fetch(where, root, changed, self.store)
        with self._lock:
            now: Seen = {}
            for name, (size, h) in found.files.items():
                if name not in changed:
                    now[name] = before[name]
                elif object_path(self.store, h).exists():
                    self._count += 1
                    now[name] = (size, h, self._count)
            self.seen[host.url] = now
            self.caches[host.url] = found.cache
        return found.files

    def round(self, settings: Settings, hosts: Sequence[FleetHost]) -> dict[str, Manifest | NodekitError]:
        """Every host observed at once; a host that fails is left out of this round (the supervisor names a lost
        one)."""

        def one(h: FleetHost) -> Manifest | NodekitError:
            try:
                return self.observe(settings, h)
            except NodekitError as e:
                return e
            except OSError as e:  # this machine's disk (or the run ending: its store removed)
                return DataError(f"the mirror of {h.name}: {e}", fix="check the disk of this machine")

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
            return dict(zip((h.url for h in hosts), pool.map(one, hosts), strict=True))

    def hand_off(self, settings: Settings, hosts: Sequence[FleetHost]) -> None:
        """Every host in ``hosts`` (the next attempt's) observed once more, then given the newest version of each
        output file it lacks; a host where that fails is named and starts with what it holds."""
        from nodekit.data.push import where_of
        from nodekit.data.transport import at_once

        with self._lock:
            self.settings, self.hosts = settings, list(hosts)
        now = self.round(settings, hosts)
        with self._lock:
            latest = newest(self.seen)
        held = {h for _, h in latest.values() if object_path(self.store, h).exists()}

        def one(h: FleetHost) -> list[str]:
            have = now[h.url]
            if isinstance(have, NodekitError):
                raise have
            todo = plan_handoff(latest, have, self.placed.get(h.url, {}), held)
            if not todo:
                return []
            answer = put(where_of(h), str(output_dir_of(settings, h.rank, Path.cwd())), todo, self.store)
            hashes = {n: x for n, x, _ in todo}
            self.placed.setdefault(h.url, {}).update({n: hashes[n] for n in answer.get("placed", [])})
            for name, why in answer.get("skipped", []):
                self.reporter.warn(f"hand-off: {h.name} kept its own {name} ({why})")
            return [str(n) for n in answer.get("placed", [])]

        names: set[str] = set()
        got = 0
        for h, result in zip(hosts, at_once(one, list(hosts)), strict=True):
            if isinstance(result, NodekitError):
                self.reporter.warn(f"hand-off to {h.name} failed, it starts with what it holds: {result.message}")
            elif result:
                names.update(result)
                got += 1
        if not names:
            self.reporter.done(f"hand-off: the {len(hosts)} host(s) left already hold the newest outputs")
            return
        ordered = sorted(names)
        shown = ", ".join(ordered[:3]) + (f" and {len(ordered) - 3} more" if len(ordered) > 3 else "")
        self.reporter.done(f"hand-off: the newest {shown} put on {got} of the {len(hosts)} host(s) left")


def restart_without(
    settings: Settings, hosts: Sequence[FleetHost], drop: Sequence[int], reporter: Reporter, keeper: Keeper | None
) -> tuple[Settings, list[FleetHost]]:
    """The settings and hosts of a restart without the ``drop`` ranks, renumbered, each host keeping its
    ``[nodes.R]`` (:func:`follow_hosts`); with an active ``keeper``, after its hand-off."""
    dropped = ", ".join(hosts[r].name for r in drop)
    reporter.warn(f"going on without {dropped} (min_nodes = {settings.min_nodes})")
    kept = [h for h in hosts if h.rank not in drop]
    new_settings = follow_hosts(settings, kept)
    new_hosts = [replace(h, rank=i) for i, h in enumerate(kept)]
    if keeper is not None and keeper.active:
        keeper.hand_off(new_settings, new_hosts)
    return new_settings, new_hosts
