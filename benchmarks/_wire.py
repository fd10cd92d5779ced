"""Pure part of the push pipeline's measurement against the raw copy rate (issue 27, item 3): nodekit's push of a
whole image to one node over SSH, with each codec, against ``cat <the image's layer files> | ssh node 'cat >
/dev/null'`` over the same SSH, and against nodekit's compressor alone on the head. The rows, their rates, the
table, and the sentence saying what bounds each push, all from the figures. No I/O here, so tests/unit check it.

Every rate is of the same bytes: the image's layers, uncompressed (the layer tars a whole-image push sends, before
compression), divided by the seconds from the command to the image on the node (for a push) or to the last byte
read on the node (for the raw copy)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._shipnet import STORES, mib, when

HOWS = {
    "raw": "raw copy: `cat` of the layer files into `ssh node 'cat > /dev/null'`",
    "compress": "nodekit's compressor alone, on the head (to memory)",
    "push": "`nodekit push`, whole image to one empty node",
}
NEAR = 0.85
"""A push at this fraction of a stage's own rate or more is taken as bound by that stage."""


@dataclass(frozen=True)
class WireRow:
    """One timed transfer of the image's ``image_bytes`` (uncompressed layer bytes): ``how`` raw, compress or push;
    ``codec`` zstd, gzip or none (raw: none); ``wire_bytes`` what went into SSH (compressed; the compressor's output
    for a compress row); ``link_bytes`` the head's interface counter (0 for a compress row)."""

    store: str
    how: str
    codec: str
    seconds: float
    image_bytes: int
    wire_bytes: int
    link_bytes: int = 0
    extra: str = ""
    run: str = ""
    """The codecs of the run that measured it (``--codecs``, e.g. "auto,gzip,none"): each run has its own raw
    copies, and a push is compared with those of its run."""


def mb_per_s(n_bytes: int, seconds: float) -> float:
    """Decimal megabytes per second (as link speeds and `dd` print them); 0 for a time of 0."""
    return n_bytes / 1e6 / seconds if seconds > 0 else 0.0


def rate(row: WireRow) -> float:
    return mb_per_s(row.image_bytes, row.seconds)


def raw_rate(rows: Sequence[WireRow], store: str, run: str) -> float | None:
    """The raw copy's rate in one run on ``store``: the mean of its raw rows (one before and one after the pushes, so
    a drift of the machine's load shows in both); None when there is none."""
    rates = [rate(r) for r in rows if (r.store, r.how, r.run) == (store, "raw", run)]
    return sum(rates) / len(rates) if rates else None


def ratio(row: WireRow, rows: Sequence[WireRow]) -> float | None:
    """``row``'s rate against the raw copy's of its run (nodekit / raw); None without a raw copy."""
    raw = raw_rate(rows, row.store, row.run)
    return rate(row) / raw if raw else None


def replaced(rows: Sequence[WireRow], store: str, codecs: Sequence[str]) -> list[WireRow]:
    """``rows`` without the earlier runs on ``store`` that measured any of ``codecs`` (a new run measures them
    again, with raw copies of its own); the other runs' rows stay whole."""
    return [r for r in rows if r.store != store or not set(r.run.split(",")) & set(codecs)]


def ordered(rows: Sequence[WireRow]) -> list[WireRow]:
    codecs = ["zstd", "gzip", "none"]
    hows = list(HOWS)

    def key(r: WireRow) -> tuple[int, str, int, int]:
        return (STORES.index(r.store) if r.store in STORES else len(STORES), r.run, hows.index(r.how),
                codecs.index(r.codec) if r.codec in codecs else len(codecs))  # fmt: skip

    return sorted(rows, key=key)


def table(rows: Sequence[WireRow]) -> list[str]:
    lines = [
        "| store | run (`--codecs`) | what | compression | time | image MB/s | into SSH | head's link sent "
        "| nodekit / raw copy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in ordered(rows):
        got = ratio(r, rows) if r.how == "push" else None
        link = mib(r.link_bytes) if r.how != "compress" else "-"
        what = HOWS[r.how] + (f", {r.extra}" if r.how == "raw" and r.extra else "")
        lines.append(
            f"| {r.store} | {r.run} | {what} | {r.codec} | {r.seconds:.1f} s | {rate(r):.0f} | {mib(r.wire_bytes)} | "
            f"{link} | {f'**{got:.2f}**' if got is not None else '-'} |"
        )
    return lines


def bound(push: WireRow, rows: Sequence[WireRow], cipher: str = "") -> str:
    """What bounds ``push``, from its rate against the stages timed alone in its run: the compressor (same codec)
    and SSH (the raw copy's rate of bytes into SSH, times this codec's ratio: a compressed stream carries more image
    per byte); the slowest stage it nearly reaches (:data:`NEAR`), else the rest of the pipeline (the node's
    decompression and ``docker load``, which no row times alone)."""
    mine = rate(push)
    raw = raw_rate(rows, push.store, push.run)
    same = (push.store, "compress", push.codec, push.run)
    comp = next((rate(r) for r in rows if (r.store, r.how, r.codec, r.run) == same), None)
    cipher_text = f"ssh's cipher ({cipher})" if cipher else "ssh's cipher"
    stages = [(f"the head's {push.codec} compressor ({comp:.0f} MB/s alone)", comp)] if comp else []
    if raw:
        cap = raw * push.image_bytes / push.wire_bytes if push.wire_bytes else raw
        scaled = f", {cap:.0f} MB/s of image at this codec's ratio" if push.codec != "none" else ""
        stages.append((f"{cipher_text} and the link (the raw copy: {raw:.0f} MB/s{scaled})", cap))
    if not stages:
        return f"{push.codec}: {mine:.0f} MB/s (nothing to compare with)"
    name, slowest = min(stages, key=lambda s: s[1])
    if mine >= NEAR * slowest:
        return f"{push.codec}: {mine:.0f} MB/s, bound by {name}"
    node = "unpacks" if push.codec == "none" else "decompresses and unpacks"
    return (f"{push.codec}: {mine:.0f} MB/s, {mine / slowest:.2f} of the slowest stage timed alone ({name}): the "
            f"rest is the node's side, which {node} every layer (`docker load`) as the stream arrives, here on the "
            "cores the head uses too")  # fmt: skip


def negotiated_cipher(ssh_debug: str) -> str:
    """The cipher an ``ssh -v`` session agreed on (``kex: server->client cipher: X``), or ""."""
    m = re.search(r"kex: (?:server->client|client->server) cipher: (\S+)", ssh_debug)
    return m[1] if m else ""


TITLE = "### The push pipeline against the raw copy rate (issue 27, item 3)"


def rows_of(doc: Sequence[Mapping[str, Any]]) -> list[WireRow]:
    """Rows as a benchmark's state.json keeps them (fields it does not know are left out)."""
    fields = WireRow.__dataclass_fields__
    return [WireRow(**{k: v for k, v in r.items() if k in fields}) for r in doc]


def part(rows: Sequence[WireRow], facts: Mapping[str, Mapping[str, Any]], image: str) -> list[str]:
    """The docs subsection of one image's measurement (``image``: "demo image", "CUDA image"); [] without rows."""
    if not rows:
        return []
    stores = [s for s in STORES if any(r.store == s for r in rows)]
    out = [
        TITLE,
        "",
        f"The whole {image} ({rows[0].image_bytes / 1e6:.0f} MB of layer files, uncompressed) to one empty node, "
        "links unshaped (no tc), with each codec; in the same run, the raw copy of the same layer files over the "
        "same SSH (the layers in the project's .nodekit/blobs/sha256 and the base's: `cat <files> | ssh node 'cat > "
        "/dev/null'`, before and after the pushes) and nodekit's compressor alone on the head. *image MB/s* is the "
        "image's uncompressed bytes over the seconds from the command to the image on the node (to the last byte "
        "read there, for the raw copy); the figure is nodekit / raw copy.",
        "",
        *(
            f"- {s} store, `--codecs {r.get('run', '?')}`: {when(r)}; ssh's cipher {r.get('cipher') or 'unknown'}."
            for s in stores
            for r in facts.get(s, {}).get("runs", [])
        ),
        "",
        *table(rows),
        "",
        "What bounds each push:",
        "",
    ]
    ciphers = {(s, r.get("run")): str(r.get("cipher") or "") for s in stores for r in facts.get(s, {}).get("runs", [])}
    for r in ordered(rows):
        if r.how == "push":
            out.append(f"- {r.store}: {bound(r, rows, ciphers.get((r.store, r.run), ''))}.")
    out.append("")
    return out
