"""The docs sections of the shipping benchmarks, rendered from their state files: both stores in one table with a
store column, each store's date and load, issue 27's verdicts per store (undecided where a run lacks the rows), the
push pipeline against the raw copy, and no text from before every layer was in the blob store."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from benchmarks import _cuda_render, _ship_render
from benchmarks._shipnet import Row
from benchmarks._wire import WireRow

MIB = 1 << 20
STALE = ("append.py", "gzip, nodekit's choice", "packages layer is BuildKit's", "still starts with a `docker save`")


def _rows(store: str, k: float) -> list[dict[str, Any]]:
    rows = [
        Row("a", "layers", 1, 1000, 40.0 * k, 330 * MIB, 329 * MIB, "zstd stream", store),
        Row("a", "layers", 4, 1000, 48.0 * k, 331 * MIB, 329 * MIB, "zstd stream, relayed to 3 of 4", store),
        Row("b", "layers", 1, 1000, 0.9 * k, 20 * 1024, 7 * 1024, "zstd stream, layer files skipped: 5", store),
        Row("b", "layers", 4, 1000, 1.8 * k, 80 * 1024, 28 * 1024, "zstd stream, layer files skipped: 20", store),
        Row("c", "layers", 1, 1000, 9.0 * k, 55 * MIB, 54 * MIB, "zstd stream", store),
        Row("c", "layers", 4, 1000, 20.0 * k, 220 * MIB, 216 * MIB, "zstd stream", store),
        Row("c", "registry", 1, 1000, 14.0, 47 * MIB, None, "push 8 s + pulls 6 s", store),
        Row("c", "registry", 4, 1000, 19.0, 190 * MIB, None, "push 8 s + pulls 11 s", store),
    ]
    return [{**dataclasses.asdict(r), "disk_peak": 11 << 30} for r in rows]


def _run(counts: list[int], when: str) -> dict[str, Any]:
    return {"counts": counts, "measured": when, "load_start": "6.1 5.2 4.3", "load_end": "7 6 5", "run_minutes": 5}


def test_the_demo_section_shows_both_stores_their_runs_and_verdicts() -> None:
    facts = {
        "classic": {"image_bytes": 1_121_934_462, "layers": 6, "mbit": 1000, "cores": 2, "save_s": 9.9,
                    "runs": [_run([1, 4], "2026-11-26 03:00 UTC")]},
        "containerd": {"image_bytes": 1_121_934_462, "layers": 6, "mbit": 1000, "save_s": 14.2,
                       "runs": [_run([1], "2026-11-26 04:00 UTC")]},
    }  # fmt: skip
    rows = _rows("classic", 1.0) + [r for r in _rows("containerd", 1.5) if r["targets"] == 1]
    text = _ship_render.render({"rows": rows, "facts": facts})
    assert text.startswith(_ship_render.TITLE + "\n")
    assert "- classic store: 1, 4 target(s) measured 2026-11-26 03:00 UTC, load 6.1 5.2 4.3 at the start" in text
    assert "- containerd store: 1 target(s) measured 2026-11-26 04:00 UTC" in text
    assert "| case | targets | store | how |" in text
    assert "| (b) code-only change (one line of train.py) | 1 | containerd |" in text
    code = "- classic: a one-line code change (b) to 4 nodes within 2 s + its wire time (2.00 s): **met**, 1.8 s."
    assert code in text
    assert "- classic: the whole image (a) to 4 nodes within 1.3x the time to 1 node (relayed): **met**" in text
    # the containerd run had 1 target only: its 4-node targets are said to be undecided, not left out
    assert "- containerd: a one-line code change (b) to 4 nodes within 2 s + its wire time: not decided" in text
    assert "- containerd: the whole image (a) to 4 nodes within 1.3x the time to 1 node: not decided" in text
    # the reasons give each store's figure for every count it measured, and none it did not
    assert "- (b): to 1 node classic 0.9 s, 7 KiB sent, containerd 1.4 s, 7 KiB sent; to 4 nodes classic 1.8 s" in text
    assert "to 4 nodes classic 1.8 s, 28 KiB sent." in text
    assert "(a `docker save` of this image takes classic 9.9 s, containerd 14.2 s)" in text
    assert not [s for s in STALE if s in text]
    assert "--phase ship --stores containerd --counts 4" in text.split("Reproduce", 1)[1]


def test_the_demo_section_carries_the_wire_measurement() -> None:
    size = 1_069_000_000
    wire = [
        WireRow("containerd", "raw", "none", 4.0, size, size, size, "before the pushes", "auto"),
        WireRow("containerd", "compress", "zstd", 2.5, size, 300 * MIB, 0, "", "auto"),
        WireRow("containerd", "push", "zstd", 30.0, size, 300 * MIB, 301 * MIB, "--compress auto", "auto"),
    ]
    state = {"wire": [dataclasses.asdict(w) for w in wire],
             "wire_facts": {"containerd": {"runs": [{"run": "auto", "measured": "D", "cipher": "c"}]}}}  # fmt: skip
    text = _ship_render.render(state)
    assert "Not measured yet" in text  # no ship rows: said, with the command
    assert "### The push pipeline against the raw copy rate (issue 27, item 3)" in text
    assert "The whole demo image (1069 MB of layer files" in text
    assert "| containerd | auto | `nodekit push`, whole image to one empty node | zstd | 30.0 s | 36 |" in text
    assert "**0.13**" in text and "- containerd: zstd: 36 MB/s" in text


def _layer(step: str, size: int, diff: str) -> dict[str, object]:
    return {"step": step, "size": size, "diff_id": diff}


def test_the_cuda_section_judges_the_package_change_against_the_registry_per_store() -> None:
    v1 = {"tag": "t1", "seconds": 92.7, "size": 5_950_000_000, "steps": {},
          "layers": [_layer("base", 172_000_000, "b"), _layer("CUDA libraries", 3_415_000_000, "c")]}  # fmt: skip
    facts = {s: {"runs": [{"phase": "ship", **_run([1, 4], "D")}], "registry_bytes_all_versions": 3000 * MIB}
             for s in ("classic", "containerd")}  # fmt: skip
    state = {
        "build": {"v1": v1, "v2": v1, "v3": v1, "save_s": 54.1, "noop_s": 1.2, "lock_s": 16.8, "measured": "then"},
        "ship_rows": _rows("classic", 1.0) + _rows("containerd", 1.6),
        "ship_facts": facts,
    }
    # a row that measured the machine's CPU while it ran: the containerd (a) to 4 (76.8 s)
    (a4,) = [r for r in state["ship_rows"] if (r["store"], r["case"], r["targets"]) == ("containerd", "a", 4)]
    a4 |= {"cpu_busy_s": 150.0, "cpu_iowait_s": 2.0}
    text = _cuda_render.render(state)
    cores = os.cpu_count() or 1
    assert (f"This machine's {cores} cores were busy 150 of the {cores * 76.8:.0f} CPU seconds the push took "
            f"({150 / (cores * 76.8):.0%}), and waited 2 s more on the disk.") in text  # fmt: skip
    assert text.count("cores were busy") == 1  # rows without the figure say nothing of it
    faster = "the package change (c) to {} faster than the registry anchor: **{}**, {} s vs {} s"
    assert "- classic: " + faster.format("1 node", "met", 9.0, 14.0) in text
    assert "- classic: " + faster.format("4 nodes", "NOT met", 20.0, 19.0) in text
    assert "- containerd: " + faster.format("1 node", "NOT met", 14.4, 14.0) in text
    assert "- containerd: the whole image (a) to 4 nodes within 1.3x the time to 1 node (relayed): **met**" in text
    assert "| (c) one package added (six) | 4 | containerd | registry: docker push + pulls |" in text
    assert "- containerd, (a) to 4 target(s): the head's link carried 331.0 MiB" in text
    assert "- containerd: the registry's blobs of the three versions" in text
    assert not [s for s in STALE if s in text]
    assert "--phase stage --stores containerd" in text and "--codecs gzip" in text


def test_a_registry_that_carries_the_layers_uncompressed_is_named() -> None:
    rows = [
        Row("a", "layers", 1, 1000, 33.6, 318 * MIB, 317 * MIB, "zstd stream", "containerd"),
        Row("a", "registry", 1, 1000, 31.2, 1100 * MIB, None, "push 12 s + pulls 19 s", "containerd"),
        Row("a", "layers", 1, 1000, 30.0, 318 * MIB, 317 * MIB, "zstd stream", "classic"),
        Row("a", "registry", 1, 1000, 40.0, 311 * MIB, None, "push 30 s + pulls 10 s", "classic"),
    ]
    facts = {"classic": {"registry_bytes_all_versions": 360 * MIB},
             "containerd": {"registry_bytes_all_versions": 1270 * MIB}}  # fmt: skip
    text = _ship_render.render({"rows": [dataclasses.asdict(r) for r in rows], "facts": facts})
    ctd = text.split("- The registry, containerd store: ", 1)[1].split("\n", 1)[0]
    assert ctd.startswith("its blobs of the three versions take 1270.0 MiB") and "pushed the layers uncompressed" in ctd
    classic = text.split("- The registry, classic store: ", 1)[1].split("\n", 1)[0]
    assert "311.0 MiB on the head's link, nodekit's push 318.0 MiB" in classic and "uncompressed" not in classic


def test_the_relay_section_judges_4_nodes_against_1_per_store_and_is_empty_without_its_rows() -> None:
    rows = [
        Row("a", "layers", 1, 40, 70.0, 330 * MIB, 329 * MIB, "zstd stream", "classic"),
        Row("a", "layers", 4, 40, 80.0, 331 * MIB, 329 * MIB, "zstd stream, relayed to 3 of 4", "classic"),
        Row("a", "layers", 1, 40, 72.0, 330 * MIB, 329 * MIB, "zstd stream", "containerd"),
        Row("a", "layers", 4, 40, 100.0, 331 * MIB, 329 * MIB, "zstd stream, relayed to 3 of 4", "containerd"),
    ]
    facts = {"measured": "2026-11-26 18:20 UTC", "load_start": "1.0 1.0 1.0", "load_end": "3.0 2.0 1.0", "cores": 2}
    state = {"relay": [dataclasses.asdict(r) for r in rows], "relay_facts": {"classic": facts, "containerd": facts}}
    text = _ship_render.render_relay(state)
    assert text.startswith(_ship_render.RELAY_TITLE)
    assert "every link at 40 Mbit/s: **met**, 80.0 s vs 70.0 s (1.14x)" in text.split("- classic: ")[-1]
    assert "every link at 40 Mbit/s: **NOT met**, 100.0 s vs 72.0 s (1.39x)" in text.split("- containerd: ")[-1]
    assert "| classic | 4 | 40 Mbit/s | 80.0 s | 331.0 MiB | 69.4 s | zstd stream, relayed to 3 of 4 |" in text
    assert _ship_render.render_relay({"relay": [dataclasses.asdict(rows[1])]}).count("not decided") == 1
    assert _ship_render.render_relay({"rows": []}) == ""


def test_the_cuda_relay_part_judges_1_3x_per_store_where_the_link_sets_the_pace() -> None:
    def row(store: str, n: int, seconds: float, busy: float) -> dict[str, Any]:
        r = Row("a", "layers", n, 100, seconds, 3000 * MIB, 2970 * MIB, "zstd stream", store)
        return {**dataclasses.asdict(r), "cpu_busy_s": busy, "measured": "D", "load_start": "1 1 1"}

    rows = [row("classic", 1, 260.0, 100.0), row("classic", 4, 280.0, 400.0), row("containerd", 1, 250.0, 120.0),
            row("containerd", 4, 340.0, 600.0)]  # fmt: skip
    text = "\n".join(_cuda_render.relay_part(rows))
    cores = os.cpu_count() or 1
    assert "- classic: the whole CUDA image (a) to 4 nodes within 1.3x the time to 1 node, every link at 100 Mbit/s: " \
           "**met**, 280.0 s vs 260.0 s (1.08x)" in text  # fmt: skip
    assert "every link at 100 Mbit/s: **NOT met**, 340.0 s vs 250.0 s (1.36x)" in text
    busy = f"{400 / (cores * 280):.0%}"
    assert f"| classic | 4 | 100 Mbit/s | 280.0 s | 3000.0 MiB | 251.7 s | {busy} | D, load 1 1 1 |" in text
    one_only = "\n".join(_cuda_render.relay_part(rows[:1]))
    assert "- classic, 100 Mbit/s: not decided, this run lacks (a) to 1 node or to 4." in one_only
    full = _cuda_render.render({"relay_rows": rows})
    assert "**Where the link sets the pace**" in full and "--phase relay --stores classic --counts 1,4" in full
