"""Launch modes: the settings that choose them, what the host renders, and what each node's launcher runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nodekit.config.settings import load
from nodekit.errors import ConfigError
from nodekit.launcher.config import parse_env
from nodekit.launcher.plan import exec_plan, local_rank_flag, parse_command
from tests.factories import CPU_NODE, GPU_NODE, LAUNCH_ENV, rendered, settings


def _env(s_kw: dict[str, object], facts: object = CPU_NODE, rank: int = 0) -> dict[str, str]:
    doc = yaml.safe_load(rendered(settings(**s_kw), rank, facts))  # type: ignore[arg-type]
    return dict(doc["services"]["train"]["environment"])


def test_fabric_settings_render_and_auto_accelerator_follows_the_nodes_gpus() -> None:
    cpu = _env({"launcher": "fabric", "nproc_per_node": 1})
    assert (cpu["NODEKIT_LAUNCHER"], cpu["NODEKIT_ACCELERATOR"], cpu["NODEKIT_STRATEGY"]) == ("fabric", "cpu", "ddp")
    assert "NODEKIT_PRECISION" not in cpu
    gpu = _env({"launcher": "fabric", "precision": "bf16-mixed", "strategy": "fsdp"}, GPU_NODE, 1)
    assert (gpu["NODEKIT_ACCELERATOR"], gpu["NODEKIT_STRATEGY"], gpu["NODEKIT_PRECISION"]) == (
        "cuda",
        "fsdp",
        "bf16-mixed",
    )
    assert "NODEKIT_ACCELERATOR" not in _env({"nproc_per_node": 1})


def test_fabric_mode_sets_what_fabric_run_sets_and_runs_torchrun() -> None:
    env = {**LAUNCH_ENV, "NODEKIT_LAUNCHER": "fabric", "NODEKIT_ACCELERATOR": "cpu", "NODEKIT_STRATEGY": "ddp"}
    plan = exec_plan(parse_env(env), parse_command(["train.py", "--x"]), torchrun="torchrun", cpus=16)
    assert plan.argv[0] == "torchrun" and plan.argv[-2:] == ("train.py", "--x")
    assert plan.argv[plan.argv.index("--nproc-per-node") + 1] == "4"
    out = plan.environ({"OMP_NUM_THREADS": "2"})
    assert {k: v for k, v in out.items() if k.startswith("LT_")} == {
        "LT_CLI_USED": "1",
        "LT_ACCELERATOR": "cpu",
        "LT_STRATEGY": "ddp",
        "LT_DEVICES": "4",
        "LT_NUM_NODES": "2",
    }
    assert out["OMP_NUM_THREADS"] == "2"  # fabric run only sets it where unset
    assert plan.environ({})["OMP_NUM_THREADS"] == "16"
    with_precision = exec_plan(parse_env({**env, "NODEKIT_PRECISION": "16-mixed"}), parse_command(["train.py"]))
    assert with_precision.environ({})["LT_PRECISION"] == "16-mixed"


@pytest.mark.parametrize(
    ("source", "flag"),
    [
        ('parser.add_argument("--local_rank", type=int, default=0)', "--local_rank"),
        ('parser.add_argument("--local-rank", "--local_rank", type=int)', "--local-rank"),
        ('parser.add_argument("--local-rank", type=int)', "--local-rank"),
        ("import os", "--local-rank"),
        (None, "--local-rank"),
    ],
)
def test_legacy_local_rank_spelling_follows_the_script(source: str | None, flag: str) -> None:
    assert local_rank_flag(source) == flag


def test_legacy_mode_appends_the_local_rank_per_worker() -> None:
    cfg = parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": "torch.distributed.launch"})
    plan = exec_plan(cfg, parse_command(["train.py", "--lr", "1"]), local_rank="--local_rank")
    # torch's agent substitutes ${local_rank} in each worker's arguments.
    assert plan.argv[-4:] == ("train.py", "--lr", "1", "--local_rank=${local_rank}")
    assert plan.argv[0] == "torchrun"


@pytest.mark.parametrize(
    ("toml", "match"),
    [
        ('launcher = "deepspeed"\n', "launcher"),
        ('precision = "bf16-mixed"\n', 'only apply to launcher = "fabric"'),
        ('launcher = "env"\nstrategy = "ddp"\n', 'only apply to launcher = "fabric"'),
    ],
)
def test_bad_launcher_settings_are_one_line(tmp_path: Path, toml: str, match: str) -> None:
    (tmp_path / "nodekit.toml").write_text('script = "train.py"\n' + toml)
    with pytest.raises(ConfigError, match=match) as e:
        load(tmp_path / "nodekit.toml")
    assert "\n" not in str(e.value)


def test_every_launcher_loads(tmp_path: Path) -> None:
    for launcher in ("torchrun", "fabric", "env", "torch.distributed.launch", "mpirun"):
        (tmp_path / "nodekit.toml").write_text(f'script = "train.py"\nlauncher = "{launcher}"\n')
        assert load(tmp_path / "nodekit.toml").launcher == launcher
