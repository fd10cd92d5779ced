"""The CUDA image's section of docs/benchmarks.md, from benchmarks/cuda_bench.py's state.json (pure but for
:func:`write_section`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import _wire
from benchmarks._project import DOCS, replace_section
from benchmarks._shipnet import (
    STORES,
    Row,
    find,
    mib,
    ordered,
    relay_verdicts,
    store_runs,
    table,
    verdicts,
    wire_seconds,
)

TITLE = "## The CUDA image (examples/cuda): building, changing and shipping 6 GB"
BEFORE = "## Method: the benchmark that decides (issue 13)"  # the section goes right after the small image's
CASES = {
    "a": "(a) whole CUDA image, empty nodes",
    "b": "(b) code-only change (one line of train.py)",
    "c": "(c) one package added (six)",
}
GPU_NOTE = (
    "GPU figures were not taken in this section's run: every figure here is from the CPU. A later session had an "
    "H200 lent: the preflight's GPU model, driver and count, and the launcher's NCCL all-reduce, are in \"GPU "
    'checks on a lent GPU machine" below (NCCL bus bandwidth between GPUs still needs a machine with two). The '
    "GPU-only paths are covered by tests on rendered output instead: the compose file's "
    "`deploy.resources.reservations.devices` for a node with GPUs (tests/unit/golden/node-1-gpu.yaml), and the "
    "preflight's CUDA, cuDNN and NCCL fields gathered in the real CUDA image, checked against what `nodekit "
    "inspect` reads from its wheels (tests/integration/test_cuda_stack.py)."
)


def gb(n: float) -> str:
    """Bytes as GB (decimal, as `docker images` prints sizes), small ones as MB or kB."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div or unit == "kB":
            return f"{n / div:.2f} {unit}" if unit == "GB" else f"{n / div:.0f} {unit}"
    return f"{n:.0f} B"


def _layer_rows(layers: Sequence[Mapping[str, Any]]) -> list[str]:
    why = {"base": "the base image", "bench base": "nothing (this run's own base layer: one file)",
           "CUDA libraries": "a new CUDA (nvidia-*, cuda-* pins)",
           "framework": "a new torch (torchvision, torchaudio, triton)", "packages": "any other pin of the lock",
           "launcher": "nodekit's launcher", "code": "the project's files",
           "workdir": "nothing (Docker's empty layer of `WORKDIR /workspace`)"}  # fmt: skip
    rows = ["| layer | size | changes with |", "| --- | --- | --- |"]
    for i, layer in enumerate(layers):
        step = "bench base" if layer["step"] == "base" and i > 0 else str(layer["step"])  # the run's own file
        rows.append(f"| {step} | {gb(layer['size'])} | {why.get(step, '')} |")
    return rows


def build_part(b: Mapping[str, Any]) -> list[str]:
    v1, v2, v3 = b["v1"], b["v2"], b["v3"]
    steps = ", ".join(f"{k} {v:.0f} s" for k, v in v1.get("steps", {}).items())
    same = [x["diff_id"] for x in v3["layers"][:3]] == [x["diff_id"] for x in v1["layers"][:3]]
    pkg = v3.get("steps", {})
    return [
        f"Measured {b['measured']}: `nodekit build` of examples/cuda (torch 2.14.1+cu130, torchvision 0.29.1, numpy; "
        "CPython 3.11 on nodekit/base:bookworm), its wheelhouse filled from the wheel cache (no download).",
        "",
        "```",
        f"cold build (--no-cache)                 {v1['seconds']:7.1f} s"
        + (f"   (BuildKit's steps: {steps})" if steps else ""),
        f"image                                   {gb(v1['size'])}   ({len(v1['layers'])} layers)",
        f"docker save (to /dev/null)              {b['save_s']:7.1f} s",
        f"no-op rebuild (`nodekit build`)          {b['noop_s']:7.1f} s",
        f"code-only change, rebuild               {v2['seconds']:7.1f} s",
        f"package change (six), nodekit lock      {b['lock_s']:7.1f} s",
        f"package change, rebuild                 {v3['seconds']:7.1f} s   (packages layer "
        f"{pkg.get('packages', 0):.0f} s; CUDA libraries and framework layers "
        f"{'reused, same diff ids' if same else 'CHANGED'})",
        "```",
        "",
        *_layer_rows(v1["layers"]),
        "",
    ]


def bump_part(u: Mapping[str, Any]) -> list[str]:
    before, after = u["before"], u["after"]
    b_layers, a_layers = before["layers"], after["layers"]
    changed = [a for a, b in zip(a_layers, b_layers, strict=False) if a["diff_id"] != b["diff_id"]]
    first = next((i for i, (a, b) in enumerate(zip(a_layers, b_layers, strict=False)) if a["diff_id"] != b["diff_id"]),
                 len(a_layers))  # fmt: skip
    sent = sum(int(x["size"]) for x in a_layers[first:])
    # CUDA libraries and framework as one layer: every layer above the base (and the bench's own base layer) changes
    merged = sum(int(x["size"]) for x in a_layers if x["step"] != "base")
    cuda_kept = not any(x["step"] == "CUDA libraries" for x in changed)
    rows = ["| layer | 2.14.0 image | 2.14.1 image | diff id |", "| --- | --- | --- | --- |"]
    for i, (a, b) in enumerate(zip(a_layers, b_layers, strict=False)):
        step = "bench base" if a["step"] == "base" and i > 0 else a["step"]
        rows.append(f"| {step} | {gb(b['size'])} | {gb(a['size'])} | "
                    f"{'same' if a['diff_id'] == b['diff_id'] else 'new'} |")  # fmt: skip
    up = after.get("steps", {})
    return [
        f"**The layer split: torch 2.14.0 -> 2.14.1** (measured {u['measured']}). The same project at torch 2.14.0 "
        f"and torchvision 0.29.0, then upgraded (`nodekit lock`, `nodekit build`). The lock changed "
        f"{', '.join(u['changed'])}{'; added ' + ', '.join(u['added']) if u['added'] else ''}"
        f"{'; removed ' + ', '.join(u['removed']) if u['removed'] else ''}: none of the nvidia-* and cuda-* pins "
        f"moved{'' if cuda_kept else ' (BUT the CUDA libraries layer changed)'}.",
        "",
        *rows,
        "",
        f"- The 2.14.0 image, cold: {before['seconds']:.0f} s; the upgrade to 2.14.1: {after['seconds']:.0f} s "
        f"(BuildKit: {', '.join(f'{k} {v:.0f} s' for k, v in up.items())}; the CUDA libraries layer was reused).",
        f"- A push of the upgrade to a node holding the 2.14.0 image sends the layers from the framework up: "
        f"{gb(sent)} uncompressed. With the CUDA libraries and torch in one framework layer, as before this split, the "
        f"same upgrade rebuilds and sends {gb(merged)}: the split makes a torch upgrade that keeps its CUDA "
        f"libraries {merged / max(sent, 1):.1f}x smaller to ship, and its rebuild skips installing the CUDA wheels "
        f"({before.get('steps', {}).get('CUDA libraries', 0):.0f} s of BuildKit's time for the 2.14.0 image).",
        "",
    ]


def _cpu_note(cpu: tuple[float, float] | None, seconds: float) -> str:
    """How busy this machine's cores were while a push ran (every virtual host shares them)."""
    if cpu is None:
        return ""
    busy, iowait = cpu
    there = (os.cpu_count() or 1) * seconds
    return (
        f" This machine's {os.cpu_count()} cores were busy {busy:.0f} of the {there:.0f} CPU seconds the push "
        f"took ({busy / max(there, 1e-9):.0%}), and waited {iowait:.0f} s more on the disk."
    )


def ship_part(rows: Sequence[Mapping[str, Any]], facts: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The shipping rows of every store in one table, each store's runs, the verdicts of issue 27 per store."""
    objs = [Row(**{k: tuple(v) if k == "samples" else v for k, v in r.items() if k in Row.__dataclass_fields__})
            for r in rows]  # fmt: skip
    peaks = {(r.get("store", "classic"), r["case"], r["targets"]): int(r.get("disk_peak", 0)) for r in rows
             if r.get("how") == "layers"}  # fmt: skip
    cpus = {(r.get("store", "classic"), r["case"], r["targets"]): (r["cpu_busy_s"], r.get("cpu_iowait_s", 0.0))
            for r in rows if r.get("how") == "layers" and "cpu_busy_s" in r}  # fmt: skip
    mbit = objs[0].mbit if objs else 1000
    size = int(b["v1"]["size"])
    stores = [s for s in STORES if any(r.store == s for r in objs)]
    counts = sorted({r.targets for r in objs})
    out = [
        f"**Shipping** ({os.cpu_count()} cores shared by every host; the load is /proc/loadavg's 1, 5 and 15 minute "
        "average at the start and end of each phase):",
        "",
        *(f"- {store_runs(facts, s)}." for s in stores),
        "",
        "As for the demo image above: the virtual cluster's head (h0) sends to "
        f"{', '.join(map(str, counts))} target host(s) over real SSH, every veth limited to {mbit} Mbit/s, from this "
        "machine's engine of the store measured (the source of `nodekit push` in the project, with its blob store; "
        "the containerd store's engine got the build's images by nodekit's push); the head and every target keep "
        "images in that store. nodekit relays from 2 targets on (`--relay auto`, its default) and picks the codec "
        "per link (the note names it). The registry anchor is Debian's `docker-registry`, one per store, pushed to "
        "once per version by that store's engine and pulled by every target through an `ssh -R` tunnel from the "
        "head; its pulls are checked by the image's identity (`ImageInfo.identity`). Each nodekit case starts from "
        "the previous version on the targets, the registry's pulls from empty nodes.",
        "",
        *table(ordered(objs), CASES),
        "",
        "Issue 27's targets, per store, against these rows:",
        "",
        *(line for s in stores for line in verdicts(objs, store=s, mbit=mbit, against_registry=True, missing=True)),
        "",
    ]
    for s in stores:
        for n in counts:
            a = find(objs, "a", "layers", n, mbit, s)
            if a is None:
                continue
            peak = peaks.get((s, "a", n), 0)
            out.append(f"- {s}, (a) to {n} target(s): the head's link carried {mib(a.link_bytes)}, "
                       f"{a.link_bytes / max(size, 1):.2f} of the image's {gb(size)} (nodekit counted "
                       f"{mib(a.nodekit_bytes or 0)}). While the targets loaded it, this machine's free disk fell by "
                       f"{gb(peak)} at the lowest, {peak / max(n * size, 1):.2f}x the image per target (the disk is "
                       "shared with other work, so this is an upper bound). The plan asks each target for 2.2x what "
                       "it lacks before anything moves." + _cpu_note(cpus.get((s, "a", n)), a.seconds))  # fmt: skip
    for s in stores:
        b1, c1 = find(objs, "b", "layers", 1, mbit, s), find(objs, "c", "layers", 1, mbit, s)
        if b1 is not None and c1 is not None:
            out.append(f"- {s}: a code-only change on the 6 GB image ships like on the demo's: "
                       f"{mib(b1.nodekit_bytes or 0)} in {b1.seconds:.1f} s to one node. A package change ships the "
                       f"packages layer and those above it ({mib(c1.nodekit_bytes or 0)}) in {c1.seconds:.1f} s: "
                       "every layer above the base is in the blob store `nodekit build` keeps, so the head reads "
                       f"nothing out of its engine (a `docker save` of the whole image took {b['save_s']:.0f} s on "
                       "the classic engine, measured above).")  # fmt: skip
    for s in stores:
        reg = facts.get(s, {}).get("registry_bytes_all_versions")
        if reg:
            out.append(f"- {s}: the registry's blobs of the three versions, as that store's engine pushed them: "
                       f"{mib(int(reg))}.")  # fmt: skip
    out.append("")
    return out


def relay_part(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The relay phase: the whole image to 1 and to 4 nodes with every link slow enough that the wire sets the pace,
    the machine's CPU while each push ran, and issue 27's 1.3x per store."""
    objs = [Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in rows]
    cores = os.cpu_count() or 1
    out = [
        "**Where the link sets the pace** (`--phase relay`): the whole image alone, to 1 node and to 4 empty nodes, "
        "with every host's veth limited to a rate at which the wire takes longer than 4 targets' loads need of this "
        f"machine's {cores} cores (at 1000 Mbit/s above, the cores set the pace). *the wire alone* is the head's "
        "bytes at that rate; *cores busy* is the share of the machine's CPU seconds used while the push ran.",
        "",
        "| store | targets | link | time | head's link sent | the wire alone | cores busy | measured | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r, raw in sorted(zip(objs, rows, strict=True), key=lambda p: (STORES.index(p[0].store), p[0].mbit,
                                                                        p[0].targets)):  # fmt: skip
        busy = f"{raw['cpu_busy_s'] / max(cores * r.seconds, 1e-9):.0%}" if "cpu_busy_s" in raw else "-"
        when = f"{raw.get('measured', '?')}, load {raw.get('load_start', '?')}"
        out.append(f"| {r.store} | {r.targets} | {r.mbit} Mbit/s | {r.seconds:.1f} s | {mib(r.link_bytes)} | "
                   f"{wire_seconds(r.link_bytes, r.mbit):.1f} s | {busy} | {when} | {r.extra} |")  # fmt: skip
    out += ["", "Issue 27's target where the link sets the pace:", ""]
    out += relay_verdicts(objs, image="CUDA image", targets=4)
    return [*out, ""]


def render(state: Mapping[str, Any]) -> str:
    lines = [TITLE, ""]
    b = state.get("build")
    if b:
        lines += build_part(b)
    if state.get("bump"):
        lines += bump_part(state["bump"])
    if state.get("ship_rows") and b:
        lines += ship_part(state["ship_rows"], state.get("ship_facts", {}), b)
    if state.get("relay_rows"):
        lines += relay_part(state["relay_rows"])
    lines += _wire.part(_wire.rows_of(state.get("wire", [])), state.get("wire_facts", {}), "CUDA image")
    lines += [
        GPU_NOTE,
        "",
        "Reproduce (root; needs `make engine engine-containerd sshd`, `apt-get install -y docker-registry`, and free "
        "disk: each phase says what it needs and refuses to start without it, about 80 GB for 4 targets on the "
        "containerd store; each line fits a 15-minute hold of the heavy lock; `--phase all` runs them all, as `make "
        "bench` does):",
        "",
        "```sh",
        'C="flock /work/heavy.lock timeout 900 .venv/bin/python benchmarks/cuda_bench.py"',
        "$C --phase bump                                        # ~6 min",
        "$C --phase build                                       # ~6 min",
        "$C --phase stage --stores containerd                   # ~4 min: the images onto that store's engine",
        "$C --phase wire --stores classic --codecs auto,none    # ~8 min; then --codecs gzip (~7 min)",
        "$C --phase ship --stores classic --counts 1 --repeats 10    # ~3 min; --counts 4 ~7",
        "$C --phase anchor --stores classic --counts 1 --repeats 10  # ~5 min (the store's pushes, once); then 4",
        "$C --phase relay --stores classic --counts 1,4              # ~10 min: links at 100 Mbit/s",
        "# the same wire, ship, anchor and relay lines with --stores containerd; where 4 targets do not fit beside the",
        "# registry, --disk-factor 2.0 (the 4-target runs peaked at 1.9 to 2.0 images per target)",
        "$C --phase clean",
        "```",
        "",
    ]
    return "\n".join(lines)


def write_section(section: str) -> None:
    doc = DOCS.read_text()
    if TITLE not in doc and BEFORE in doc:
        doc = doc.replace(BEFORE, f"{TITLE}\n\n{BEFORE}", 1)
    DOCS.write_text(replace_section(doc, TITLE, section))
