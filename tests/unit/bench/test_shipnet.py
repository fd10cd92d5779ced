"""benchmarks/_shipnet.py: link counters from `ip -s -j link`, the tc arguments, the table and the verdicts."""

from __future__ import annotations

import json

import pytest

from benchmarks._shipnet import Row, ordered, relay_verdicts, table, tbf_argv, tx_bytes, verdicts

# What `ip -s -j link` printed in a host's namespace (trimmed to the fields it has on iproute2 6.1).
IP_LINK = json.dumps(
    [
        {"ifindex": 1, "ifname": "lo", "stats64": {"rx": {"bytes": 10, "packets": 1}, "tx": {"bytes": 10}}},
        {
            "ifindex": 5,
            "ifname": "net0",
            "link_index": 4,
            "stats64": {"rx": {"bytes": 2048, "packets": 20}, "tx": {"bytes": 1234567890123, "packets": 99}},
        },
    ]
)


def test_tx_bytes_reads_the_named_interface() -> None:
    assert tx_bytes(IP_LINK, "net0") == 1234567890123
    assert tx_bytes(IP_LINK, "lo") == 10


def test_tx_bytes_names_a_missing_interface_or_missing_counters() -> None:
    with pytest.raises(ValueError, match="no interface eth1"):
        tx_bytes(IP_LINK, "eth1")
    without_stats = json.dumps([{"ifindex": 5, "ifname": "net0"}])
    with pytest.raises(ValueError, match="with -s"):
        tx_bytes(without_stats, "net0")


def test_tbf_bucket_scales_with_the_rate_and_has_a_floor() -> None:
    fast = tbf_argv("net0", 1000)
    assert fast[:6] == ["qdisc", "replace", "dev", "net0", "root", "tbf"]
    assert fast[fast.index("rate") + 1] == "1000mbit"
    assert int(fast[fast.index("burst") + 1]) == 500_000  # 4 ms at 1 Gbit/s
    slow = tbf_argv("h1", 1)
    assert int(slow[slow.index("burst") + 1]) == 64 * 1024


def _rows() -> list[Row]:
    return [
        Row("a", "layers", 1, 1000, 10.0, 500 * 2**20, 480 * 2**20),
        Row("a", "layers", 4, 1000, 30.0, 2000 * 2**20, 1920 * 2**20),
        Row("b", "layers", 4, 1000, 1.5, 200 * 1024, 150 * 1024, "16 layer files skipped"),
        Row("b", "registry", 4, 1000, 3.0, 300 * 1024, None, "push 1 s + pulls 2 s"),
    ]


def test_table_has_one_line_per_row_with_units() -> None:
    lines = table(_rows())
    assert len(lines) == 2 + 4
    assert lines[0].startswith("| case | targets | store | how |")
    assert lines[2].startswith(
        "| (a) whole demo image, empty nodes | 1 | classic | nodekit push, only missing layers (relayed when 64 MiB+ "
        "travel) |"
    )
    assert "| 500.0 MiB | 480.0 MiB |" in lines[2]
    assert "| 200 KiB | 150 KiB | 16 layer files skipped |" in lines[4]
    assert "| 300 KiB | - | push 1 s + pulls 2 s |" in lines[5]  # a registry pull has no nodekit count


def test_verdicts_say_met_or_not_with_the_numbers() -> None:
    out = verdicts(_rows(), store="classic", mbit=1000, image_wire=480 * 2**20)
    assert len(out) == 3
    # the code change's wire time: its 200 KiB on the head's link at 1 Gbit/s
    assert "(b) to 4 nodes" in out[0] and "**met**" in out[0] and "(2.00 s)" in out[0]
    assert "(a) to 4 nodes within 1.3x" in out[1] and "**NOT met**" in out[1] and "3.00x" in out[1]
    assert "head's bytes" in out[2] and "**NOT met**" in out[2] and "4.17x" in out[2]


def test_verdicts_leave_out_what_was_not_measured() -> None:
    only_b = [r for r in _rows() if r.case == "b"]
    assert len(verdicts(only_b, store="classic", mbit=1000)) == 1
    assert verdicts([], store="classic", mbit=1000, image_wire=1) == []
    assert verdicts(_rows(), store="containerd", mbit=1000) == []  # no row of that store


def test_relay_verdicts_judge_a_named_count_or_the_most_nodes_in_images_own_words() -> None:
    mib = 1 << 20
    rows = [Row("a", "layers", n, 40, s, 300 * mib, 299 * mib, "", "classic") for n, s in ((1, 70.0), (4, 80.0),
            (8, 100.0))]  # fmt: skip
    assert relay_verdicts(rows, image="CUDA image", targets=4) == [
        "- classic: the whole CUDA image (a) to 4 nodes within 1.3x the time to 1 node, every link at 40 Mbit/s: "
        "**met**, 80.0 s vs 70.0 s (1.14x); the head's link carried 300.0 MiB for 4 nodes, 300.0 MiB for one."
    ]
    assert relay_verdicts(rows, image="image") == [
        "- classic: the whole image (a) to 8 nodes within 1.3x the time to 1 node, every link at 40 Mbit/s: "
        "**NOT met**, 100.0 s vs 70.0 s (1.43x); the head's link carried 300.0 MiB for 8 nodes, 300.0 MiB for one."
    ]
    assert relay_verdicts(rows[:1], image="CUDA image", targets=4) == [
        "- classic, 40 Mbit/s: not decided, this run lacks (a) to 1 node or to 4."
    ]
    assert relay_verdicts(rows[:1], image="image") == [
        "- classic, 40 Mbit/s: not decided, this run lacks (a) to 1 node or to more."
    ]
    assert relay_verdicts([], image="image") == []


def test_ordered_puts_the_main_speed_first_then_case_targets_and_how() -> None:
    rows = [
        Row("b", "registry", 1, 100, 1.0, 1),
        Row("b", "whole", 2, 1000, 1.0, 1),
        Row("b", "layers", 2, 1000, 1.0, 1),
        Row("a", "layers", 4, 1000, 1.0, 1),
        Row("a", "layers", 1, 1000, 1.0, 1),
    ]
    got = [(r.case, r.how, r.targets, r.mbit) for r in ordered(rows)]
    assert got == [
        ("a", "layers", 1, 1000),
        ("a", "layers", 4, 1000),
        ("b", "layers", 2, 1000),
        ("b", "whole", 2, 1000),
        ("b", "registry", 1, 100),
    ]


def test_the_section_states_targets_reasons_and_how_to_reproduce() -> None:
    import dataclasses

    from benchmarks import _ship_render

    rows = [
        *_rows(),
        Row("b", "layers", 1, 1000, 1.2, 50 * 1024, 9 * 1024),
        Row("c", "layers", 1, 1000, 9.0, 260 * 2**20, 259 * 2**20),
        Row("b", "layers", 1, 100, 1.3, 50 * 1024, 9 * 1024),
    ]
    run = {"counts": [1, 4], "measured": "2026-11-22 19:02 UTC", "load_start": "1.0 2.0 3.0", "load_end": "4 5 6"}
    facts = {"classic": {"image_bytes": 1121934462, "layers": 5, "mbit": 1000, "runs": [run]}}
    state = {"rows": [dataclasses.asdict(r) for r in rows], "facts": facts}
    text = _ship_render.render(state)
    assert text.startswith(_ship_render.TITLE + "\n")
    assert "classic store: 1, 4 target(s) measured 2026-11-22 19:02 UTC, load 1.0 2.0 3.0 at the start" in text
    assert "1122 MB, 5 layers" in text
    assert text.count("**NOT met**") == 2 and text.count("**met**") == 1
    assert "they form a relay chain" in text and "the head streams the image once" in text
    assert "At 100 Mbit/s, case (b) to one node: classic layers 1.3 s" in text
    assert "not timed here" in text  # no save_s in facts: said, not invented
    assert "append.py" not in text and "gzip, nodekit's choice" not in text  # gone with the blob store
    assert "benchmarks/ship_bench.py" in text.split("Reproduce", 1)[1]
