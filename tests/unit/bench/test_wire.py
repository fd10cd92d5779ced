"""benchmarks/_wire.py (and the pure parts of _wirerun.py): the push pipeline against the raw copy rate: rates of
the same bytes, the ratio within one run, which earlier runs a new one replaces, the table and the sentence on what
bounds each push."""

from __future__ import annotations

import pytest

from benchmarks import _wire
from benchmarks._wire import WireRow, bound, mb_per_s, negotiated_cipher, rate, ratio, raw_rate, replaced
from benchmarks._wirerun import parse_codecs

SIZE = 1_000_000_000  # the image's layer files, uncompressed
RUN = "auto,gzip,none"


def _run(store: str = "classic", run: str = RUN) -> list[WireRow]:
    return [
        WireRow(store, "raw", "none", 4.0, SIZE, SIZE, SIZE + 5_000_000, "before the pushes", run),  # 250 MB/s
        WireRow(store, "raw", "none", 6.0, SIZE, SIZE, SIZE + 5_000_000, "after the pushes", run),  # 167 MB/s
        WireRow(store, "compress", "zstd", 2.0, SIZE, 300_000_000, 0, "", run),  # 500 MB/s
        WireRow(store, "compress", "gzip", 20.0, SIZE, 330_000_000, 0, "", run),  # 50 MB/s
        WireRow(store, "push", "zstd", 40.0, SIZE, 300_000_000, 302_000_000, "--compress auto", run),  # 25 MB/s
        WireRow(store, "push", "gzip", 21.0, SIZE, 330_000_000, 332_000_000, "--compress gzip", run),  # 48 MB/s
        WireRow(store, "push", "none", 5.5, SIZE, SIZE, SIZE + 6_000_000, "--compress none", run),  # 182 MB/s
    ]


def test_rates_are_of_the_images_uncompressed_bytes() -> None:
    assert mb_per_s(500_000_000, 2.0) == 250.0
    assert mb_per_s(1, 0.0) == 0.0
    push = _run()[4]
    assert rate(push) == 25.0  # 1 GB in 40 s, whatever went on the wire


def test_the_ratio_is_against_the_mean_raw_rate_of_the_same_run() -> None:
    rows = [*_run(), *[WireRow("classic", "raw", "none", 1.0, SIZE, SIZE, 0, "", "gzip")]]
    raw = raw_rate(rows, "classic", RUN)
    assert raw == pytest.approx((250 + 1000 / 6) / 2)
    assert raw_rate(rows, "classic", "gzip") == 1000.0 and raw_rate(rows, "containerd", RUN) is None
    assert ratio(rows[4], rows) == pytest.approx(25 / raw)
    lone = WireRow("containerd", "push", "zstd", 10.0, SIZE, 1, 1, "", RUN)
    assert ratio(lone, [*rows, lone]) is None  # no raw copy in its run: no figure invented


def test_a_new_run_replaces_the_runs_that_measured_its_codecs() -> None:
    rows = [*_run("classic", "auto,none"), *_run("classic", "gzip"), *_run("containerd", RUN)]
    after = replaced(rows, "classic", ["gzip"])
    assert {(r.store, r.run) for r in after} == {("classic", "auto,none"), ("containerd", RUN)}
    assert replaced(rows, "classic", ["auto", "gzip", "none"]) == _run("containerd", RUN)


def test_the_table_shows_every_rate_and_the_ratio_of_the_pushes() -> None:
    rows = [*_run("containerd"), *_run("classic")]
    lines = _wire.table(rows)
    assert len(lines) == 2 + len(rows)
    body = lines[2:]
    assert body[0].startswith("| classic | auto,gzip,none | raw copy") and ", before the pushes |" in body[0]
    assert all(line.startswith("| classic") for line in body[:7])
    push_zstd = next(line for line in body if "`nodekit push`" in line and "| zstd |" in line)
    assert "| 40.0 s | 25 | 286.1 MiB | 288.0 MiB | **0.12** |" in push_zstd
    compress = next(line for line in body if "compressor alone" in line)
    assert "| - | - |" in compress  # no link, no ratio for the head alone


def test_bound_names_the_stage_a_push_nearly_reaches() -> None:
    rows = _run()
    zstd, gzip, none = rows[4], rows[5], rows[6]
    # gzip: 48 MB/s against its compressor's 50 alone (SSH would carry 208 x 1000/330 = 631 MB/s of image)
    assert "bound by the head's gzip compressor (50 MB/s alone)" in bound(gzip, rows, "aes128-gcm@openssh.com")
    # none: 182 MB/s against the raw copy's 208: ssh's cipher and the link
    got = bound(none, rows, "aes128-gcm@openssh.com")
    assert got == ("none: 182 MB/s, bound by ssh's cipher (aes128-gcm@openssh.com) and the link (the raw copy: "
                   "208 MB/s)")  # fmt: skip
    # zstd: 25 MB/s, far below its compressor (500) and SSH at its ratio (208 x 1000/300 = 694): the node's side
    got = bound(zstd, rows)
    assert got.startswith("zstd: 25 MB/s, 0.05 of the slowest stage timed alone (the head's zstd compressor (500")
    assert "`docker load`" in got


def test_a_compressed_stream_is_bound_by_ssh_at_its_ratio() -> None:
    rows = [
        WireRow("classic", "raw", "none", 10.0, SIZE, SIZE, 0, "", "auto"),  # 100 MB/s into SSH
        WireRow("classic", "compress", "zstd", 1.0, SIZE, SIZE // 4, 0, "", "auto"),  # 1000 MB/s alone
        WireRow("classic", "push", "zstd", 2.6, SIZE, SIZE // 4, 0, "", "auto"),  # 385 MB/s: over the raw copy's 100
    ]
    assert bound(rows[2], rows) == ("zstd: 385 MB/s, bound by ssh's cipher and the link (the raw copy: 100 MB/s, "
                                    "400 MB/s of image at this codec's ratio)")  # fmt: skip


def test_bound_without_anything_to_compare_says_so() -> None:
    push = WireRow("classic", "push", "none", 5.0, SIZE, SIZE)
    assert bound(push, [push]) == "none: 200 MB/s (nothing to compare with)"


def test_the_negotiated_cipher_is_read_from_ssh_v() -> None:
    debug = (
        "debug1: kex: algorithm: sntrup761x25519-sha512@openssh.com\n"
        "debug1: kex: server->client cipher: chacha20-poly1305@openssh.com MAC: <implicit> compression: none\n"
    )
    assert negotiated_cipher(debug) == "chacha20-poly1305@openssh.com"
    assert negotiated_cipher("Permission denied") == ""


def test_codecs_are_parsed_in_order_and_checked() -> None:
    assert parse_codecs("none,auto") == ["auto", "none"]
    assert parse_codecs("gzip") == ["gzip"]
    for bad in ("zstd", "", "auto,lz4"):  # zstd is what auto picks here; it is asked as auto
        with pytest.raises(ValueError, match="auto, gzip, none"):
            parse_codecs(bad)


def test_the_subsection_names_each_run_its_load_and_cipher() -> None:
    rows = _run()
    facts = {"classic": {"runs": [{"run": RUN, "measured": "D", "load_start": "5 5 5", "load_end": "6 6 6",
                                   "cipher": "chacha20-poly1305@openssh.com"}]}}  # fmt: skip
    text = "\n".join(_wire.part(rows, facts, "CUDA image"))
    assert text.startswith(_wire.TITLE) and "The whole CUDA image (1000 MB of layer files" in text
    assert "- classic store, `--codecs auto,gzip,none`: measured D, load 5 5 5 at the start" in text
    assert "ssh's cipher chacha20-poly1305@openssh.com." in text
    assert text.count("- classic: ") == 3  # one sentence per push
    assert _wire.part([], facts, "demo image") == []
