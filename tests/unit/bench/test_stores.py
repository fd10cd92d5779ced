"""benchmarks/_shipnet.py and _project.py: the store dimension of the shipping benchmarks (the table's store column,
issue 27's verdicts per store, the disk a phase needs, the runs a section names) and how results accumulate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks._project import kept
from benchmarks._shipnet import (
    DISK_HEADROOM,
    Row,
    by_store,
    disk_need,
    ordered,
    parse_stores,
    store_runs,
    table,
    verdicts,
)

MIB = 1 << 20


def _rows(store: str, k: float = 1.0) -> list[Row]:
    """One store's rows: (a) 4 nodes at 1.25x one node, (b) 4 nodes in 1.9 s, (c) faster than the registry to 1
    node and slower to 4."""
    return [
        Row("a", "layers", 1, 1000, 40.0 * k, 330 * MIB, 329 * MIB, "zstd stream", store),
        Row("a", "layers", 4, 1000, 50.0 * k, 331 * MIB, 329 * MIB, "zstd stream, relayed to 3 of 4", store),
        Row("b", "layers", 4, 1000, 1.9 * k, 80 * 1024, 28 * 1024, "zstd stream", store),
        Row("c", "layers", 1, 1000, 10.0 * k, 55 * MIB, 54 * MIB, "zstd stream", store),
        Row("c", "registry", 1, 1000, 14.0, 47 * MIB, None, "push 8 s + pulls 6 s", store),
        Row("c", "layers", 4, 1000, 30.0 * k, 220 * MIB, 216 * MIB, "zstd stream", store),
        Row("c", "registry", 4, 1000, 19.0, 190 * MIB, None, "push 8 s + pulls 11 s", store),
    ]


def test_stores_are_parsed_in_the_tables_order_and_checked() -> None:
    assert parse_stores("containerd,classic") == ["classic", "containerd"]
    assert parse_stores(" containerd ") == ["containerd"]
    for bad in ("overlay2", "", "classic,zfs"):
        with pytest.raises(ValueError, match="classic and/or containerd"):
            parse_stores(bad)


def test_the_table_has_a_store_column_and_puts_the_stores_side_by_side() -> None:
    rows = ordered([*_rows("containerd", 1.2), *_rows("classic")])
    got = [(r.case, r.targets, r.store, r.how) for r in rows[:4]]
    assert got == [("a", 1, "classic", "layers"), ("a", 1, "containerd", "layers"), ("a", 4, "classic", "layers"),
                   ("a", 4, "containerd", "layers")]  # fmt: skip
    lines = table(rows)
    assert lines[0].split(" | ")[:4] == ["| case", "targets", "store", "how"]
    assert "| 1 | containerd | nodekit push" in lines[3] and "| 48.0 s |" in lines[3]


def test_rows_written_before_there_were_two_stores_are_the_classic_stores() -> None:
    old = {"case": "b", "how": "layers", "targets": 1, "mbit": 1000, "seconds": 2.1, "link_bytes": 1, "extra": ""}
    assert Row(**old).store == "classic"  # type: ignore[arg-type]


def test_verdicts_per_store_with_the_registry_anchor() -> None:
    rows = [*_rows("classic"), *_rows("containerd", 1.2)]
    classic = verdicts(rows, store="classic", mbit=1000, against_registry=True)
    assert [v.split(":", 1)[0] for v in classic] == ["- classic"] * 4
    code, pkg1, pkg4, whole = classic
    assert "code change (b) to 4 nodes" in code and "**met**, 1.9 s" in code
    assert "(c) to 1 node faster than the registry anchor: **met**, 10.0 s vs 14.0 s" in pkg1
    assert "(c) to 4 nodes faster than the registry anchor: **NOT met**, 30.0 s vs 19.0 s" in pkg4
    assert "**met**" in whole and "(1.25x)" in whole
    ctd = verdicts(rows, store="containerd", mbit=1000, against_registry=True)
    assert "**NOT met**, 2.3 s" in ctd[0]  # 1.9 s x 1.2 is past 2 s plus 80 KiB's wire time
    assert "(1.25x)" in ctd[3]
    # the demo's section: no registry verdict; a store without rows: nothing
    assert len(verdicts(rows, store="classic", mbit=1000)) == 2
    assert verdicts(_rows("classic"), store="containerd", mbit=1000, against_registry=True) == []


def test_a_wire_time_that_is_not_negligible_raises_the_code_change_bound() -> None:
    slow = [Row("b", "layers", 4, 10, 2.5, 1_000_000, 900_000, "", "classic")]
    (line,) = verdicts(slow, store="classic", mbit=10)
    assert "(2.80 s)" in line and "**met**, 2.5 s" in line  # 1 MB at 10 Mbit/s: 0.8 s on the wire


def test_by_store_names_each_store_that_has_the_row() -> None:
    rows = [*_rows("classic"), *_rows("containerd", 2.0)]
    secs = by_store(rows, lambda r: f"{r.seconds:.1f} s", case="b", how="layers", targets=4, mbit=1000)
    assert secs == "classic 1.9 s, containerd 3.8 s"
    assert by_store(rows, str, case="b", how="layers", targets=2, mbit=1000) == ""


def test_disk_need_counts_targets_staging_registry_and_headroom() -> None:
    from nodekit.ship import DISK_FACTOR

    gb6 = 6_000_000_000
    assert disk_need(gb6, 1) == int(gb6 * DISK_FACTOR) + DISK_HEADROOM
    four = disk_need(gb6, 4, staging=True, registry=True)
    assert four == int(4 * gb6 * DISK_FACTOR) + 3 * gb6 + DISK_HEADROOM
    assert 75e9 < four < 90e9  # "about 80 GB" for 4 targets of the CUDA image on the containerd store


def test_store_runs_name_each_run_with_its_date_and_load() -> None:
    facts = {"classic": {"runs": [
        {"counts": [1, 2], "measured": "D1", "load_start": "5.0 4.0 3.0", "load_end": "6 5 4", "run_minutes": 6.5},
        {"counts": [4], "measured": "D2", "load_start": "7 7 7", "load_end": "8 8 8"},
    ]}}  # fmt: skip
    text = store_runs(facts, "classic")
    assert text == ("classic store: 1, 2 target(s) measured D1, load 5.0 4.0 3.0 at the start and 6 5 4 at the end, "
                    "6.5 minutes; 4 target(s) measured D2, load 7 7 7 at the start and 8 8 8 at the end")  # fmt: skip
    # state written before runs were kept: the store's own date and load
    assert store_runs({"classic": {"measured": "D0", "load": "1 1 1"}}, "classic").startswith(
        "classic store: measured D0"
    )


def test_a_phase_run_again_replaces_its_rows_and_keeps_the_others() -> None:
    rows = [{"store": "classic", "case": "a", "n": 1, "s": 1.0}, {"store": "containerd", "case": "a", "n": 1, "s": 2.0}]
    got = kept(rows, {"store": "classic", "case": "a", "n": 1, "s": 3.0}, ("store", "case", "n"))
    assert got == [rows[1], {"store": "classic", "case": "a", "n": 1, "s": 3.0}]
    assert kept(got, {"store": "classic", "case": "b", "n": 1}, ("store", "case", "n"))[:2] == got


def test_a_repeated_package_change_is_decided_on_an_interval_not_on_one_sample() -> None:
    def pair(ours: tuple[float, ...], reg: tuple[float, ...]) -> list[Row]:
        return [Row("c", "layers", 1, 1000, 0.0, 0, 0, "", "containerd", ours),
                Row("c", "registry", 1, 1000, 0.0, 0, None, "", "containerd", reg)]  # fmt: skip

    def line(ours: tuple[float, ...], reg: tuple[float, ...]) -> str:
        (got,) = verdicts(pair(ours, reg), store="containerd", mbit=1000, against_registry=True)
        return got

    faster = line((4.0, 4.2, 3.9, 4.1, 4.0), (5.1, 5.3, 5.0, 5.2, 5.4))
    assert "**met**, median 4.0 s vs 5.2 s, difference -1.2 s [" in faster
    assert "nodekit 4.0, 4.2, 3.9, 4.1, 4.0; registry 5.1, 5.3, 5.0, 5.2, 5.4" in faster
    assert "**NOT met**" in line((5.1, 5.3, 5.0, 5.2, 5.4), (4.0, 4.2, 3.9, 4.1, 4.0))
    # one sample each side ahead, the other behind: the interval spans 0 s
    assert "**undecided**" in line((4.0, 5.5, 4.1, 5.4, 4.8), (4.9, 4.2, 5.3, 4.0, 5.0))
    # fewer than 3 samples on a side: the single-sample comparison of the rows' times, as before
    (single,) = verdicts([replace(r, seconds=s, samples=(s,)) for r, s in zip(pair((), ()), (3.0, 4.0), strict=True)],
                         store="containerd", mbit=1000, against_registry=True)  # fmt: skip
    assert single.endswith("**met**, 3.0 s vs 4.0 s.")
