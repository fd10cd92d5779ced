"""The shipping phases of benchmarks/cuda_bench.py, per image store, on the virtual cluster of
benchmarks/_shipcluster.py (cluster name ``nkg``):

- ``wire``: links unshaped, the whole CUDA image to one empty node with each codec, beside the raw copy of the same
  layer files over the same SSH and nodekit's compressor alone (benchmarks/_wirerun.py);
- ``ship``: links limited to 1 Gbit/s, (a) the whole image to N empty nodes, (b) the code change, (c) the package
  change, relayed as nodekit does by default; the least free disk seen while the targets load;
- ``anchor``: the registry: the store's engine pushes each version once (timed once per store), then N empty nodes
  pull them through SSH tunnels from the head.

The head sends from this machine's engine of the store (no copy into h0's engine); on the containerd store the
build's images are put on that engine first with nodekit's push. Every phase checks the free disk first and the
cluster's data roots are purged when it ends.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._project import cpu_s, kept, loadavg, now_utc
from benchmarks._shipnet import Row, disk_need

CLUSTER = "nkg"
DATA = Path("/var/lib/nodekit-cluster")
REPO = "nodekit/cuda-bench"
GIB = 1 << 30
DISK_FACTOR = 2.2
"""What each target is assumed to hold at its peak, in images (nodekit's plan asks for 2.2x; the 4-target runs of
2026-11-27 peaked at 1.89 to 2.02x): cuda_bench's --disk-factor sets it for a disk that 2.2x does not fit."""

Save = Callable[[dict[str, Any]], None]


class DiskWatch:
    """The least free space seen on the targets' file system (every 0.5 s) while a push runs: the targets' data
    roots all live on this machine's disk, so the drop is what their loads held together at their peak."""

    def __init__(self, path: Path) -> None:
        self.path, self._stop = path, threading.Event()
        self.start = self.low = self.free()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.low = min(self.low, self.free())

    def __enter__(self) -> DiskWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    @property
    def peak_used(self) -> int:
        return max(0, self.start - self.low)


@contextmanager
def cpu_used() -> Iterator[dict[str, float]]:
    """This machine's CPU seconds (:func:`cpu_s`: every process, the virtual hosts' included) spent while the block
    runs, 0.1 s rounded, as the rows record them: ``cpu_busy_s`` and ``cpu_iowait_s``, in the dict given once the
    block has ended."""
    used: dict[str, float] = {}
    start = cpu_s()
    yield used
    used["cpu_busy_s"], used["cpu_iowait_s"] = (round(b - a, 1) for a, b in zip(start, cpu_s(), strict=True))


def free_disk() -> int:
    st = os.statvfs(DATA if DATA.exists() else Path("/"))
    return st.f_bavail * st.f_frsize


def check_disk(need: int, what: str) -> None:
    """SystemExit before anything starts when this machine's disk has less than ``need`` bytes free."""
    free = free_disk()
    if free < need:
        raise SystemExit(f"{what} needs about {need / GIB:.0f} GiB free on this disk, {free / GIB:.0f} GiB is "
                         "(run --phase clean, or free space)")  # fmt: skip


def _built(state: dict[str, Any]) -> tuple[dict[str, str], Path, int]:
    if not isinstance(state.get("build"), dict):
        raise SystemExit("run --phase build first (the shipping phases send its three images)")
    b = state["build"]
    tags = {case: b[v]["tag"] for case, v in (("a", "v1"), ("b", "v2"), ("c", "v3"))}
    return tags, Path(b["project"]) / ".nodekit" / "blobs", int(b["v1"]["size"])


def _staged(state: dict[str, Any], store: str) -> bool:
    return store == "classic" or bool(state.get("staged", {}).get(store))


def _source(state: dict[str, Any], store: str, save: Save) -> str:
    """This machine's engine of ``store``, holding the three images and their base (put there once)."""
    from benchmarks._shipcluster import engine_of, stage

    tags, blobs, _ = _built(state)
    source = engine_of(store)
    if not _staged(state, store):
        added = stage(list(tags.values()), source, blobs, state.get("base"))
        state.setdefault("added", {})[store] = added
        state.setdefault("staged", {})[store] = True
        save(state)
    return source


def _run_facts(state: dict[str, Any], store: str, phase: str, n: int, started: float, load_start: str) -> None:
    facts = state.setdefault("ship_facts", {}).setdefault(store, {})
    run = {"phase": phase, "counts": [n], "load_start": load_start, "load_end": loadavg(), "measured": now_utc(),
           "run_minutes": round((time.monotonic() - started) / 60, 1)}  # fmt: skip
    facts["runs"] = kept(facts.get("runs", []), run, ("phase", "counts"))


def _record(state: dict[str, Any], save: Save, row: Row, **more: object) -> None:
    new = {**dataclasses.asdict(row), **more}
    state["ship_rows"] = kept(state.get("ship_rows", []), new, ("store", "case", "how", "targets", "mbit"))
    save(state)
    print(f"cuda bench: {row} {more}", flush=True)


def phase_stage(state: dict[str, Any], store: str, save: Save) -> None:
    """The build's three images on ``store``'s engine (nothing to do on the classic one, where they were built)."""
    _, _, size = _built(state)
    if not _staged(state, store):
        check_disk(disk_need(size, 0, staging=True), f"putting the images on the {store} store's engine")
    _source(state, store, save)


def phase_wire(state: dict[str, Any], store: str, codecs: list[str], save: Save) -> None:
    """The push pipeline against the raw copy rate: 1 target, unshaped (benchmarks/_wirerun.py)."""
    from benchmarks import _wirerun

    tags, blobs, size = _built(state)
    check_disk(
        disk_need(size, 1, staging=not _staged(state, store), factor=DISK_FACTOR),
        f"the wire phase on the {store} store",
    )
    source = _source(state, store, save)
    _wirerun.phase(state, store, codecs, cluster=CLUSTER, work=Path(state["work"]), ref=tags["a"], source=source,
                   blobs=blobs, save=save)  # fmt: skip


def phase_ship(state: dict[str, Any], store: str, n: int, mbit: int, save: Save, repeats: int = 1) -> None:
    """Cases a, b, c to ``n`` empty targets with nodekit, relayed as by default, links at ``mbit``; c ``repeats``
    times (the row's time is the median)."""
    from benchmarks._shipcluster import ShipCluster
    from benchmarks.stats import median

    tags, blobs, size = _built(state)
    check_disk(
        disk_need(size, n, staging=not _staged(state, store), factor=DISK_FACTOR), f"{n} targets on the {store} store"
    )
    source = _source(state, store, save)
    t0, load_start = time.monotonic(), loadavg()
    with ShipCluster(CLUSTER, n, store, Path(state["work"])) as c:
        c.shape(mbit)
        for case in "abc":
            with cpu_used() as cpu, DiskWatch(DATA) as disk:
                got = c.push(tags[case], c.targets, source=source, blobs=blobs)
            samples, sent = [got.seconds], [got.link_bytes]
            for _ in range(repeats - 1 if case == "c" else 0):  # again from the version below it on the targets
                c.remove(c.targets, [tags[case]])
                again = c.push(tags[case], c.targets, source=source, blobs=blobs)
                samples.append(again.seconds)
                sent.append(again.link_bytes)
            row = Row(case, "layers", n, mbit, median(samples), got.link_bytes, got.sent, got.note(n), store,
                      tuple(samples))  # fmt: skip
            _record(state, save, row, disk_peak=disk.peak_used, sample_link_bytes=sent, **cpu)
    _run_facts(state, store, "ship", n, t0, load_start)
    save(state)


def phase_anchor(state: dict[str, Any], store: str, n: int, mbit: int, save: Save, repeats: int = 1) -> None:
    """The registry anchor on ``store``: each version pushed once by the store's engine (the first time this phase
    runs for the store), then pulled by ``n`` empty targets, links at ``mbit``; c pulled ``repeats`` times."""
    from benchmarks._shipcluster import ShipCluster, registry_bytes, registry_push
    from benchmarks.stats import median
    from nodekit.system import docker

    tags, _, size = _built(state)
    work = Path(state["work"])
    regdir = work / f"registry-{store}"
    pushed = (regdir / "data" / "docker").is_dir()
    need = disk_need(size, n, staging=not _staged(state, store), registry=not pushed, factor=DISK_FACTOR)
    check_disk(need, f"the registry anchor to {n} targets on the {store} store")
    source = _source(state, store, save)
    facts = state.setdefault("ship_facts", {}).setdefault(store, {})
    if not pushed or "registry_push_s" not in facts:
        facts["registry_push_s"] = registry_push(regdir, source, tags, REPO)
        facts["registry_bytes_all_versions"] = registry_bytes(regdir)
        save(state)
    # What each pull must give, asked of the source once per image (by tag: a new build has new tags), so that a
    # later count can run after the source's copies were removed to give the targets the disk.
    known = facts.setdefault("identity", {})
    if any(tag not in known for tag in tags.values()):
        known.update({tag: docker.require_image(tag, source).identity for tag in tags.values()})
        save(state)
    identity = {case: known[tag] for case, tag in tags.items()}
    t0, load_start = time.monotonic(), loadavg()
    with ShipCluster(CLUSTER, n, store, work) as c:
        c.shape(mbit)
        c.registry_for_targets(regdir)
        for case in "abc":
            ref, push_s = f"localhost:5000/{REPO}:{case}", facts["registry_push_s"][case]
            seconds, link = c.pull(ref, c.targets, identity[case])
            samples, sent = [round(push_s + seconds, 2)], [link]
            for _ in range(repeats - 1 if case == "c" else 0):  # again from the version below it on the targets
                c.remove(c.targets, [ref])
                again_s, again_link = c.pull(ref, c.targets, identity[case])
                samples.append(round(push_s + again_s, 2))
                sent.append(again_link)
            note = f"head's docker push {push_s:.1f} s (once) + pulls {seconds:.1f} s"
            row = Row(case, "registry", n, mbit, median(samples), link, None, note, store, tuple(samples))
            _record(state, save, row, sample_link_bytes=sent)
    _run_facts(state, store, "anchor", n, t0, load_start)
    save(state)


def phase_relay(state: dict[str, Any], store: str, n: int, mbit: int, save: Save) -> None:
    """The whole image (a) alone to ``n`` empty targets with every link at ``mbit``, a rate at which the wire and
    not the machine's shared cores sets the pace: the relay's 1.3x from 1 node to 4 (issue 27), with the machine's
    CPU while it ran (``relay_rows``)."""
    from benchmarks._shipcluster import ShipCluster

    tags, blobs, size = _built(state)
    check_disk(disk_need(size, n, staging=not _staged(state, store), factor=DISK_FACTOR),
               f"{n} targets on the {store} store")  # fmt: skip
    source = _source(state, store, save)
    t0, load_start = time.monotonic(), loadavg()
    with ShipCluster(CLUSTER, n, store, Path(state["work"])) as c:
        c.shape(mbit)
        with cpu_used() as cpu, DiskWatch(DATA) as disk:
            got = c.push(tags["a"], c.targets, source=source, blobs=blobs)
    row = Row("a", "layers", n, mbit, got.seconds, got.link_bytes, got.sent, got.note(n), store)
    new = {**dataclasses.asdict(row), **cpu, "disk_peak": disk.peak_used,
           "measured": now_utc(), "load_start": load_start, "load_end": loadavg(),
           "run_minutes": round((time.monotonic() - t0) / 60, 1)}  # fmt: skip
    state["relay_rows"] = kept(state.get("relay_rows", []), new, ("store", "targets", "mbit"))
    save(state)
    print(f"cuda bench: relay {row} cpu {cpu['cpu_busy_s']} s busy, {cpu['cpu_iowait_s']} s iowait", flush=True)
