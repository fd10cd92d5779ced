"""Reading a job's printed log in the real-engine tiers: the progress bar of examples/ddp/train.py --progress."""

from __future__ import annotations

import re


def bars(text: str, rank: int) -> tuple[list[str], list[str]]:
    """Node ``rank``'s progress-bar lines in a printed log: the redraws shown (``7/21``), and the bars' last
    states (``21/21``), in order."""
    found = re.findall(rf"^\[node {rank}\] epoch \d+ \|[# ]*\| (\d+)/(\d+) *$", text, re.M)
    return [f"{a}/{b}" for a, b in found if a != b], [f"{a}/{b}" for a, b in found if a == b]
