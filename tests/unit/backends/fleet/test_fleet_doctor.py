"""``nodekit doctor --fleet``: the job's own settings, turned into a run that checks and does not train."""

from __future__ import annotations

from pathlib import Path

from nodekit.backends.fleet.doctor import checks_settings
from nodekit.config.settings import Settings
from nodekit.job.container import MAIN_ADDR, RANK
from nodekit.job.env import node_env
from nodekit.job.spec import launch_spec, node_spec
from nodekit.launcher.config import LaunchConfig, parse_env
from nodekit.system.host.facts import HostFacts

CPU = HostFacts(gpu_count=0, memlock_hard=None, stack_hard=None)


def _launcher_config(s: Settings) -> LaunchConfig:
    launch = launch_spec(s)
    holes = {RANK: "1", MAIN_ADDR: "10.0.0.5"}
    rendered = node_env(node_spec(s, launch, 1, "10.0.0.5", CPU), CPU)
    env = {v.name: holes[v.value] if not isinstance(v.value, str) else v.value
           for v in rendered if isinstance(v.value, str) or v.value in holes}  # fmt: skip
    return parse_env(env)


def test_the_checks_run_stops_after_the_checks_and_never_restarts() -> None:
    job = Settings(
        project_dir=Path("/srv/p"), script="train.py", nnodes=3, restarts=2, max_restarts=1,
        env={"NCCL_DEBUG": "WARN"}, health={"links": "off", "min_link_gbit": 10, "gpus": "refuse"},
    )  # fmt: skip
    checked = checks_settings(job)
    assert (checked.restarts, checked.max_restarts) == (0, 0)
    assert checked.env == {"NCCL_DEBUG": "WARN", "NODEKIT_CHECKS_ONLY": "1"}
    cfg = _launcher_config(checked)
    assert (cfg.checks_only, cfg.link_check, cfg.min_link_gbit, cfg.gpu_health) == (True, "warn", 10.0, "refuse")
    assert job.env == {"NCCL_DEBUG": "WARN"}  # the job's own settings are untouched


def test_a_refusing_link_policy_is_kept() -> None:
    job = Settings(project_dir=Path("/srv/p"), script="train.py", nnodes=2, health={"links": "refuse"})
    assert _launcher_config(checks_settings(job)).link_check == "refuse"
