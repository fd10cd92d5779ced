"""pass_env: variables forwarded by name; no value is ever rendered, whatever the shell holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nodekit.backends.compose.node import unset_pass_env
from nodekit.backends.compose.render import render_compose
from nodekit.config.settings import load
from nodekit.errors import ConfigError
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from tests.factories import CPU_NODE, rendered, settings

SECRET = "s3cr3t-value-0123456789"


def test_names_are_rendered_without_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    text = rendered(settings(pass_env=("WANDB_API_KEY", "HF_TOKEN"), nproc_per_node=1), 0, CPU_NODE)
    env = yaml.safe_load(text)["services"]["train"]["environment"]
    assert env["WANDB_API_KEY"] is None and env["HF_TOKEN"] is None  # compose takes them from its shell
    assert SECRET not in text


def test_a_pass_env_name_never_replaces_nodekits_own_variables() -> None:
    """Refused in the settings, as in env (never accepted and silently ignored, nor, for a name nodekit does not
    always write such as WORLD_SIZE, taken from the shell); and render keeps nodekit's value anyway."""
    for name in ("MASTER_ADDR", "WORLD_SIZE", "NODEKIT_JOB_SECRET", "NODEKIT_PREFLIGHT"):
        with pytest.raises(ValueError, match=f"{name} is set by nodekit itself"):
            settings(pass_env=(name,))
    s = settings(nproc_per_node=1)
    launch = launch_spec(s).model_copy(update={"pass_env": ("MASTER_ADDR",)})
    doc = render_compose(
        plan_container(node_spec(s, launch, 0, "10.0.0.5", CPU_NODE), CPU_NODE, image="x:y", output_dir=Path("/o"))
    )
    assert doc["services"]["train"]["environment"]["MASTER_ADDR"] == "10.0.0.5"


def test_unset_variables_are_named_in_a_warning() -> None:
    warnings = unset_pass_env(("WANDB_API_KEY", "HF_TOKEN"), {"WANDB_API_KEY": SECRET})
    assert len(warnings) == 1 and "HF_TOKEN is not set" in warnings[0]
    assert SECRET not in warnings[0]


@pytest.mark.parametrize("name", ["1TOKEN", "HF-TOKEN", "A B", ""])
def test_an_invalid_name_is_one_line(tmp_path: Path, name: str) -> None:
    (tmp_path / "nodekit.toml").write_text(f'script = "t.py"\npass_env = ["{name}"]\n')
    with pytest.raises(ConfigError, match="pass_env") as e:
        load(tmp_path / "nodekit.toml")
    assert "\n" not in str(e.value)
