"""What a run record reads from a Slurm job: each line's node (srun --label) and the job's hosts (NodeList)."""

from __future__ import annotations

import pytest

from nodekit.backends.slurm.follow import hostnames, labelled


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("0: nodekit preflight: ok, 2/2 nodes", (0, "nodekit preflight: ok, 2/2 nodes")),
        ("12: step 3", (12, "step 3")),
        ("  1: indented by srun for alignment", (1, "indented by srun for alignment")),
        ("nodekit: checking 2 node(s)", (None, "nodekit: checking 2 node(s)")),
        ("10:30:12 a time is not a label", (None, "10:30:12 a time is not a label")),
    ],
)
def test_a_labelled_line_names_its_node(line: str, parsed: tuple[int | None, str]) -> None:
    assert labelled(line) == parsed


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("h0", ["h0"]),
        ("h[0-2]", ["h0", "h1", "h2"]),
        ("gpu[08-10,12],login1", ["gpu08", "gpu09", "gpu10", "gpu12", "login1"]),
        ("(null)", []),
        ("", []),
    ],
)
def test_a_slurm_host_list_is_written_out(nodelist: str, names: list[str]) -> None:
    assert hostnames(nodelist) == names
