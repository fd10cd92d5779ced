"""The one-call form of planning a node that the unit tests use: gather its world on this machine, then plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodekit.backends.compose.node import NodePlan, plan_node
from nodekit.config.settings import Settings
from nodekit.job.gather import gather_node


def plan_here(
    settings: Settings, rank: int, main: str, *, debug: bool = False, out_dir: Path | None = None, **gather: Any
) -> NodePlan:
    """:func:`nodekit.job.gather.gather_node` (``gather``: its keyword arguments), then
    :func:`nodekit.backends.compose.node.plan_node`."""
    return plan_node(settings, rank, gather_node(settings, rank, main, **gather), debug=debug, out_dir=out_dir)
