"""The one-call form of planning a node that the unit tests use: gather its world on this machine, then plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodekit.node import NodePlan, plan_node
from nodekit.settings import Settings
from nodekit.world import gather_node


def plan_here(
    settings: Settings, rank: int, main: str, *, debug: bool = False, out_dir: Path | None = None, **gather: Any
) -> NodePlan:
    """:func:`nodekit.world.gather_node` (``gather``: its keyword arguments), then :func:`nodekit.node.plan_node`."""
    return plan_node(settings, rank, gather_node(settings, rank, main, **gather), debug=debug, out_dir=out_dir)
