"""The push pipeline against the raw copy rate, measured (issue 27, item 3; the pure part is benchmarks/_wire.py):
on an unshaped virtual cluster (no tc), the whole image to one empty node with each codec, beside the raw copy of
the same bytes over the same SSH and nodekit's compressor alone on the head, all in one run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks._project import loadavg, now_utc
from benchmarks._shipcluster import ShipCluster
from benchmarks._wire import WireRow, negotiated_cipher, replaced, rows_of

CODECS = ("auto", "gzip", "none")
"""--compress as the pushes are asked: auto (zstd here, where both ends have the zstd command), gzip, none."""


def _chunks(files: Sequence[Path]) -> Iterator[bytes]:
    for path in files:
        with open(path, "rb") as f:
            while piece := f.read(1 << 20):
                yield piece


def compress_alone(files: Sequence[Path], codec: str) -> tuple[float, int]:
    """nodekit's own compressor (nodekit.ship.compressed: zstd -1 -T0, or gzip level 1 in-process) over ``files``,
    to memory: seconds and compressed bytes."""
    from nodekit import ship

    n, t0 = 0, time.monotonic()
    for out in ship.compressed(_chunks(files), codec):  # type: ignore[arg-type]
        n += len(out)
    return round(time.monotonic() - t0, 2), n


def parse_codecs(text: str) -> list[str]:
    """``--codecs auto,gzip,none`` (any of them, each once, in that order); ValueError naming a bad one."""
    asked = [c.strip() for c in text.split(",") if c.strip()]
    if not asked or any(c not in CODECS for c in asked):
        raise ValueError(f"--codecs takes {', '.join(CODECS)}, comma-separated, not {text!r}")
    return [c for c in CODECS if c in asked]


def measure(
    c: ShipCluster,
    ref: str,
    *,
    source: str,
    blobs: Path,
    files: Sequence[Path],
    codecs: Sequence[str],
    record: Callable[[WireRow], None],
) -> str:
    """One run on ``c``'s store: the raw copy, nodekit's compressor alone and a push for each of ``codecs``
    (``--compress`` values), the raw copy again; every row handed to ``record`` as it is measured. Returns the
    negotiated ssh cipher."""
    from nodekit import ship

    target = c.targets[0]
    size = sum(p.stat().st_size for p in files)
    run = ",".join(codecs)

    def raw(extra: str) -> None:
        seconds, link = c.raw_copy(files, target)
        record(WireRow(c.store, "raw", "none", seconds, size, size, link, extra, run))

    raw("before the pushes")
    auto = "zstd" if ship.zstd_here() else "gzip"  # what auto picks toward a node that has zstd
    for codec in dict.fromkeys(auto if x == "auto" else x for x in codecs if x != "none"):
        seconds, out = compress_alone(files, codec)
        record(WireRow(c.store, "compress", codec, seconds, size, out, 0, "", run))
    for compress in codecs:
        c.wipe([target])
        got = c.push(ref, [target], source=source, blobs=blobs, relay="never", compress=compress)
        codec = "/".join(got.codecs) or compress
        record(WireRow(c.store, "push", codec, got.seconds, size, got.sent, got.link_bytes, f"--compress {compress}",
                       run))  # fmt: skip
    c.wipe([target])
    raw("after the pushes")
    return negotiated_cipher(c.ssh_debug(target))


def phase(
    state: dict[str, Any],
    store: str,
    codecs: Sequence[str],
    *,
    cluster: str,
    work: Path,
    ref: str,
    source: str,
    blobs: Path,
    save: Callable[[dict[str, Any]], None],
) -> None:
    """One run of :func:`measure` on a cluster of a head and one target on ``store``, its rows in ``state["wire"]``
    (replacing the earlier runs that measured any of ``codecs``) and its date, load and cipher in
    ``state["wire_facts"][store]["runs"]``; saved after every row."""
    from benchmarks._shipcluster import ShipCluster, layer_files

    files = layer_files(ref, source, blobs, work / "base-layers")
    run = ",".join(codecs)
    state["wire"] = [asdict(r) for r in replaced(rows_of(state.get("wire", [])), store, codecs)]
    facts = state.setdefault("wire_facts", {}).setdefault(store, {})
    facts["runs"] = [r for r in facts.get("runs", []) if not set(str(r.get("run", "")).split(",")) & set(codecs)]
    started = {"run": run, "load_start": loadavg(), "image": ref}

    def record(row: WireRow) -> None:
        state["wire"].append(asdict(row))
        save(state)
        print(f"wire: {row}", flush=True)

    with ShipCluster(cluster, 1, store, work) as c:
        cipher = measure(c, ref, source=source, blobs=blobs, files=files, codecs=codecs, record=record)
    facts["runs"].append({**started, "measured": now_utc(), "load_end": loadavg(), "cipher": cipher})
    save(state)
