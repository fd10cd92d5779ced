"""The base-image benchmark's docs section: what it says and where it goes."""

from __future__ import annotations

from benchmarks import base_bench
from benchmarks._project import replace_section


def test_the_section_states_sizes_and_the_kept_torch() -> None:
    text = base_bench.section(1050.8, 1159.9, ["# provided: torch==2.13.0+cpu", "lightning==2.6.6", "six==1.17"], 42.0)
    assert text.startswith(base_bench.TITLE)
    assert "| base (torch preinstalled) | 1050.8 MB | |" in text
    assert "| derived (adds lightning) | 1159.9 MB | +109.1 MB over the base |" in text
    assert "`# provided: torch==2.13.0+cpu`" in text and "installs 2 packages of its own" in text


def test_the_section_replaces_its_old_self_and_keeps_the_rest() -> None:
    doc = f"# B\n\n## Before\n\nx\n\n{base_bench.TITLE}\n\nold numbers\n\n## After\n\ny\n"
    out = replace_section(doc, base_bench.TITLE, f"{base_bench.TITLE}\n\nnew numbers\n")
    assert "old numbers" not in out and "new numbers" in out
    assert out.index("## Before") < out.index("new numbers") < out.index("## After") and out.endswith("y\n")
    appended = replace_section("# B\n", base_bench.TITLE, f"{base_bench.TITLE}\n\nfirst\n")
    assert appended == f"# B\n\n{base_bench.TITLE}\n\nfirst\n"
