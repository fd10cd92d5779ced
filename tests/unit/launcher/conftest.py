"""Builders for the launcher's unit tests: a node's environment as nodekit renders it, from settings."""

from __future__ import annotations

from pathlib import Path

from nodekit.config.settings import Settings
from nodekit.job.container import MAIN_ADDR, RANK
from nodekit.job.env import node_env as rendered_env
from nodekit.job.spec import launch_spec, node_spec
from nodekit.system.host.facts import HostFacts

CPU = HostFacts(gpu_count=0, memlock_hard=None, stack_hard=None, iface="eth0", local_addr="10.0.0.6")


def node_env(rank: int = 1, **kw: object) -> dict[str, str]:
    """Node ``rank``'s environment for a 2-node job (main 10.0.0.5) with settings ``kw``, as the compose file has it."""
    base: dict[str, object] = {"name": "demo", "script": "train.py", "nnodes": 2}
    s = Settings(project_dir=Path("/srv/demo"), **(base | kw))  # type: ignore[arg-type]
    launch = launch_spec(s)
    node = node_spec(s, launch, rank, "10.0.0.5", CPU)
    holes = {RANK: str(rank), MAIN_ADDR: "10.0.0.5"}
    return {v.name: holes.get(v.value, v.value) if not isinstance(v.value, str) else v.value
            for v in rendered_env(node, CPU) if isinstance(v.value, str) or v.value in holes}  # fmt: skip
