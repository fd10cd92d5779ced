"""``nodekit doctor --fleet``: on every host of ``nodekit run``, what a real run checks before its first worker.

The same containers as ``nodekit run`` (same image, shipped where missing; same compose files; same job secret per
run), started with ``NODEKIT_CHECKS_ONLY=1``: each node's launcher runs the preflight (same stack on every node),
every node's GPU health and the link check between every pair of nodes, prints them, and exits with their verdict
instead of training. The link check runs even when the job's ``[health] links`` is "off" (that is what was asked
for), as a warning unless the job says "refuse"; nothing is restarted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nodekit.backends.fleet import run
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.config.settings import Settings
from nodekit.launcher.contract import Env
from nodekit.system.progress import Reporter


def checks_settings(settings: Settings) -> Settings:
    """The job's settings as the checks-only run uses them (pure)."""
    health = settings.health
    if health.links == "off":
        health = health.model_copy(update={"links": "warn"})
    env = {**settings.env, Env.CHECKS_ONLY: "1"}
    return settings.model_copy(update={"env": env, "restarts": 0, "max_restarts": 0, "health": health})


def check_fleet(
    settings: Settings,
    hosts: Sequence[FleetHost],
    reporter: Reporter,
    on_line: Callable[[int, str], None],
    *,
    image: str | None = None,
) -> int:
    """Run the checks on every host; 0 when they passed (warnings included), else JobFailed with the refusal's
    exit code (17 stack mismatch, 18 a node missing, 20 a link, 21 a GPU)."""
    return run.run(checks_settings(settings), hosts, reporter, on_line, image=image)
