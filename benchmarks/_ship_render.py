"""The demo image's shipping section of docs/benchmarks.md, from benchmarks/ship_bench.py's state.json (pure but for
:func:`write_section`): the rows of both image stores in one table with a store column, each store's date and load,
the verdicts of issue 27 per store, the push pipeline against the raw copy rate, and the measured reasons."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks import _wire
from benchmarks._project import DOCS, replace_section
from benchmarks._shipnet import (
    STORES,
    Row,
    by_store,
    find,
    mib,
    ordered,
    relay_verdicts,
    store_runs,
    table,
    verdicts,
    wire_seconds,
)

TITLE = "## Shipping the image: whole vs only the layers a node lacks"


def rows_of(state: Mapping[str, Any]) -> list[Row]:
    fields = Row.__dataclass_fields__
    return [Row(**{k: v for k, v in r.items() if k in fields}) for r in state.get("rows", [])]


def render(state: Mapping[str, Any]) -> str:
    rows = rows_of(state)
    facts: Mapping[str, Mapping[str, Any]] = state.get("facts", {})
    stores = [s for s in STORES if any(r.store == s for r in rows)]
    first = facts.get(stores[0], {}) if stores else {}
    mbit = int(first.get("mbit", 1000))
    counts = sorted({r.targets for r in rows})
    lines = [TITLE, ""]
    if not rows:
        lines += ["Not measured yet: run `benchmarks/ship_bench.py --phase build`, then `--phase ship`.", ""]
    else:
        lines += [
            "Measured by `benchmarks/ship_bench.py`, one run per image store (the machine's load is the 1, 5 and 15 "
            f"minute average of /proc/loadavg; {first.get('cores', '?')} cores shared by every host; "
            f"{first.get('mem_available_gib_with_cluster', '?')} GiB memory still available with the cluster up):",
            "",
            *(f"- {store_runs(facts, s)}." for s in stores),
            "",
            f"The virtual cluster's head (h0) sends the demo image (examples/ddp, "
            f"{int(first.get('image_bytes', 0)) / 1e6:.0f} MB, {first.get('layers', '?')} layers) to "
            f"{', '.join(map(str, counts))} target host(s) over real SSH (`ssh://root@<addr>`), from this machine's "
            "engine of the store measured, whose unix socket h0 reaches (the source of `nodekit push` in the project, "
            "with the blob store `nodekit build` wrote); the head and every target keep images in that store. Every "
            f"host's veth is limited with `tc` tbf to {mbit} Mbit/s in both directions. One run per row.",
            "",
            "- *head's link sent*: tx bytes of h0's interface (`ip -s -j link`) before and after: what crossed the "
            "head's uplink, SSH and TCP included.",
            "- *nodekit counted*: the compressed bytes nodekit wrote into the targets' loads (PushResult.sent), in the "
            "codec nodekit chose for the link (the note names it: zstd where the head and the node both have the "
            "zstd command, as here, decompressed by the node's zstd before its `docker load`; gzip otherwise).",
            "- *relayed*: when 64 MiB or more travel to 2 or more targets (`--relay auto`, nodekit's default), the "
            "targets pass the stream on to each other (a chain over SSH, nodekit/ship/relay.py) and the head sends "
            "it once. *no relay* and *whole image* rows (`--extras`) are the same pushes with `--relay never` or "
            "every layer sent, as before issue 10.",
            "- *registry*: Debian's `docker-registry`, one per store; the store's engine pushes each version once "
            "(that time is added to every row of that version) and each target `docker pull`s it through an `ssh "
            "-R` tunnel from the head, in parallel; the pulled image is checked by its identity "
            "(`ImageInfo.identity`: a pull on the containerd store gives the image another id than nodekit's load).",
            "- (b) is one line appended to train.py; (c) adds the pure-Python package `six` (`nodekit lock`, `nodekit "
            "build`; torch stays 2.13.0). Each case starts from the previous version on the targets: (a) empty "
            "nodes, (b) nodes with (a)'s image, (c) nodes with (b)'s; the registry's pulls start from empty nodes.",
            "",
            *table(ordered(rows)),
            "",
            "Issue 27's targets, per store, against these rows:",
            "",
        ]
        a1 = find(rows, "a", "layers", 1, mbit, stores[0])
        for s in stores:
            lines += verdicts(rows, store=s, mbit=mbit, image_wire=a1.nodekit_bytes if a1 else None, missing=True)
        lines += ["", *why(rows, facts, mbit)]
    lines += _wire.part(_wire.rows_of(state.get("wire", [])), state.get("wire_facts", {}), "demo image")
    lines += reproduce()
    return "\n".join(lines)


def per_count(rows: Sequence[Row], fmt: Callable[[Row], str], *, case: str, how: str, mbit: int) -> str:
    """A figure of each store for every target count measured: "to 1 node classic 0.9 s, containerd 1.1 s; ..."."""
    counts = sorted({r.targets for r in rows if (r.case, r.how, r.mbit) == (case, how, mbit)})
    return "; ".join(f"to {n} node{'s' if n > 1 else ''} "
                     + by_store(rows, fmt, case=case, how=how, targets=n, mbit=mbit) for n in counts)  # fmt: skip


def why(rows: Sequence[Row], facts: Mapping[str, Mapping[str, Any]], mbit: int) -> list[str]:
    """The measured reasons behind the verdicts, one paragraph each (only for what was measured)."""
    out = ["Why, from these measurements:", ""]

    def secs(r: Row) -> str:
        return f"{r.seconds:.1f} s"

    def sent(r: Row) -> str:
        return f"{r.seconds:.1f} s, {mib(r.nodekit_bytes or 0)} sent"

    b = per_count(rows, sent, case="b", how="layers", mbit=mbit)
    if b:
        saves = ", ".join(f"{s} {f['save_s']} s" for s, f in facts.items() if "save_s" in f)
        reg = per_count(rows, secs, case="b", how="registry", mbit=mbit)
        out.append(
            f"- (b): {b}. The code layer and the image config travel from the blob store `nodekit build` keeps, as "
            "every layer above the base does (nodekit/image/layers.py), so the head reads nothing out of its engine "
            f"(a `docker save` of this image takes {saves or 'a while: not timed here'}) on either store. What "
            "remains is per target: the survey (the engine's facts, then three questions at once), the load and the "
            "image id check, over one SSH connection per node (nodekit/ship/mux.py), each a docker CLI process on the "
            "head and a `docker system dial-stdio` on the target. On this machine they all share its cores, which is "
            "why the time grows with the number of targets; on a cluster each target's side runs on its own CPU."
            + (f" A registry pull of the same change: {reg}." if reg else "")
        )
    a = per_count(rows, lambda r: f"{r.seconds:.1f} s ({mib(r.link_bytes)} on the head's link)", case="a",
                  how="layers", mbit=mbit)  # fmt: skip
    if a:
        out.append(
            f"- (a): {a}. From 2 targets on they form a relay chain (nodekit/ship/relay.py): the head streams the "
            "image once, to the first node, and each node passes it on over SSH while it loads it. The time is bound "
            "by CPU, not by the links: every host shares this machine's cores, which run every node's decompression "
            "and unpacking and every hop's SSH encryption at once; on a cluster each node does its own share on its "
            "own CPU. The next section measures the same push where the link, not the CPU, sets the pace."
        )
    c = per_count(rows, sent, case="c", how="layers", mbit=mbit)
    if c:
        out.append(
            f"- (c): {c}. Adding a package rebuilds the packages layer (every pin but the framework's and the CUDA "
            "libraries') and the layers above it: nodekit sends those from the blob store, like the code layer; the "
            "framework layer (torch) and the base stay on the nodes."
            + (
                " What travels is under the relay's 64 MiB threshold (`--relay auto`), so the head feeds each node "
                "itself."
                if any(r.case == "c" and r.how == "layers" and r.targets > 1 and "relayed" not in r.extra for r in rows)
                else ""
            )
        )
    for s, f in facts.items():
        a_reg, a_nk = find(rows, "a", "registry", 1, mbit, s), find(rows, "a", "layers", 1, mbit, s)
        if a_reg is not None and a_nk is not None and "registry_bytes_all_versions" in f:
            out.append(
                f"- The registry, {s} store: its blobs of the three versions take "
                f"{mib(int(f['registry_bytes_all_versions']))}, as that store's engine pushed them; a pull of (a) to "
                f"one node carried {mib(a_reg.link_bytes)} on the head's link, nodekit's push {mib(a_nk.link_bytes)}."
                + (" This engine pushed the layers uncompressed, as it holds them from nodekit's load (the containerd "
                   "store keeps a loaded layer's blob as it came)." if a_reg.link_bytes > 2 * a_nk.link_bytes else "")
            )  # fmt: skip
    slow = [r for r in rows if r.mbit != mbit]
    if slow:
        parts = ", ".join(f"{r.store} {r.how} {r.seconds:.1f} s ({mib(r.link_bytes)})" for r in ordered(slow))
        out.append(f"- At {slow[0].mbit} Mbit/s, case (b) to one node: {parts}.")
    out.append("")
    return out


def reproduce() -> list[str]:
    return [
        "Reproduce (root; needs `make engine engine-containerd sshd` and `apt-get install -y docker-registry`; the "
        "cluster is named `nkb` and is torn down, data purged, after each phase, also on failure; each line fits a "
        "15-minute hold of the heavy lock; `make bench` runs `--phase all`):",
        "",
        "```sh",
        'B="flock /work/heavy.lock timeout 900 .venv/bin/python benchmarks/ship_bench.py"',
        "$B --phase build                                        # ~2 min",
        "$B --phase wire --stores classic,containerd             # ~4 min per store",
        "$B --phase ship --stores classic --counts 1,2           # ~6 min",
        "$B --phase ship --stores classic --counts 4             # ~6 min",
        "$B --phase ship --stores containerd --counts 1,2        # ~6 min",
        "$B --phase ship --stores containerd --counts 4          # ~6 min",
        "$B --phase clean                                        # the images it added, the registries, the project",
        "```",
        "",
    ]


RELAY_TITLE = "## The relay where the link sets the pace"


def render_relay(state: Mapping[str, Any]) -> str:
    """The relay phase's section: the whole image to 1 node and to 4 with every link slow enough that the wire, not
    the shared cores, sets the pace, and issue 27's 1.3x target per store ("" when the state has no such rows)."""
    rows = [Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in state.get("relay", [])]
    if not rows:
        return ""
    facts: Mapping[str, Mapping[str, Any]] = state.get("relay_facts", {})
    stores = [st for st in STORES if any(r.store == st for r in rows)]
    lines = [
        RELAY_TITLE,
        "",
        "Measured by `benchmarks/ship_bench.py --phase relay`, one run per image store:",
        "",
        *(_relay_run(st, facts.get(st, {})) for st in stores),
        "",
        "In the section above, with every link at 1000 Mbit/s, the whole image to 4 nodes took about twice as long "
        "as to one: all five hosts share this machine's 2 cores, and every node's decompression and unpacking and "
        "every hop's SSH encryption run on them at once, so the CPU sets the pace there, not the links. On a cluster "
        "each node does its share on its own CPU, and the head's uplink and the wire set the pace. This phase "
        "measures the relay in that regime: the same push of the whole demo image (a) from the same blob store, to "
        "1 node and to 4 empty nodes (relayed: the head streams the image once, each node passes it on while it "
        "loads it, nodekit/ship/relay.py), with every host's veth limited (`tc` tbf, both directions) to a rate at "
        "which the wire takes longer than the shared cores need for 4 nodes' work. *the wire alone* is the bytes "
        "on the head's link at that rate.",
        "",
        "| store | targets | link | time | head's link sent | the wire alone | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (STORES.index(r.store), r.mbit, r.targets)):
        lines.append(f"| {r.store} | {r.targets} | {r.mbit} Mbit/s | {r.seconds:.1f} s | {mib(r.link_bytes)} | "
                     f"{wire_seconds(r.link_bytes, r.mbit):.1f} s | {r.extra} |")  # fmt: skip
    lines += ["", "Issue 27's target, per store, where the link sets the pace:", ""]
    lines += relay_verdicts(rows, image="image")
    lines += [
        "",
        "Reproduce: `flock /work/heavy.lock .venv/bin/python benchmarks/ship_bench.py --phase build`, then `--phase "
        "relay` (`--relay-mbit 40`, `--stores classic,containerd`; about 4 minutes per store), then `--phase clean`.",
        "",
    ]
    return "\n".join(lines)


def _relay_run(store: str, f: Mapping[str, Any]) -> str:
    return (f"- {store} store: {f.get('measured', '?')}, load {f.get('load_start', '?')} at the start, "
            f"{f.get('load_end', '?')} at the end, {f.get('cores', '?')} cores shared by every host.")  # fmt: skip


def write_section(section: str) -> None:
    """``section`` in place of the section of docs/benchmarks.md with its title (its first line)."""
    DOCS.write_text(replace_section(DOCS.read_text(), section.splitlines()[0], section))
