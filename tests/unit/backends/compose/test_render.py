"""Golden tests of rendered compose files: every host fact comes in as data, nothing is read from the machine.

Regenerate after an intended change with NODEKIT_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from nodekit.config.settings import Settings
from nodekit.system.host.facts import HostFacts
from tests.factories import CPU_NODE, GPU_NODE, rendered, settings
from tests.golden import GOLDEN, update_golden

# Values Compose would substitute from the shell of whoever runs it, were they not written $$.
DOLLARS = {
    "args": ("--name", "exp-$USER-${RUN:-default}", "cost=$HOME", "$$", "a'b\"c d", "ünï", "tail\\"),
    "env": {"EXPERIMENT": "exp-$USER-${RUN:-default}", "PRICE": "$5 and $$"},
    "pass_env": ("HF_TOKEN",),
    "mounts": ({"host": "/srv/$DATA/${X:-y}", "container": "/data/$1 ü\\", "check": "sizes"},),
}


@pytest.mark.parametrize(
    ("golden", "rank", "facts", "kw"),
    [
        ("node-0-cpu.yaml", 0, CPU_NODE, {"nproc_per_node": 1}),
        ("node-1-gpu.yaml", 1, GPU_NODE, {}),
        ("node-0-literal.yaml", 0, CPU_NODE, {"nproc_per_node": 1, **DOLLARS}),
    ],
)
def test_golden(golden: str, rank: int, facts: HostFacts, kw: dict[str, object]) -> None:
    text = rendered(settings(**kw), rank, facts)
    path = GOLDEN / golden
    update_golden(path, text)
    assert text == path.read_text()


def svc(text: str) -> dict[str, object]:
    doc = yaml.safe_load(text)
    service: dict[str, object] = doc["services"]["train"]
    return service


def test_cpu_node_has_no_gpu_reservation_and_no_memlock() -> None:
    s = svc(rendered(settings(), 1, CPU_NODE))
    assert "deploy" not in s
    assert "memlock" not in s["ulimits"]  # type: ignore[operator]
    assert s["network_mode"] == "host" and s["ipc"] == "host"
    env = s["environment"]
    assert isinstance(env, dict)
    assert env["NODE_RANK"] == "1" and env["MASTER_ADDR"] == "10.0.0.5"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "WORLD_SIZE" not in env  # nproc_per_node=auto: other nodes may differ


def test_gpu_node_reserves_all_gpus_and_passes_infiniband() -> None:
    s = svc(rendered(settings(), 1, GPU_NODE))
    devices = s["deploy"]["resources"]["reservations"]["devices"]  # type: ignore[index]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert s["ulimits"]["memlock"] == {"soft": -1, "hard": -1}  # type: ignore[index]
    assert s["cap_add"] == ["IPC_LOCK"]
    assert "NCCL_IB_DISABLE" not in s["environment"]  # type: ignore[operator]
    assert s["environment"]["NPROC_PER_NODE"] == "8"  # type: ignore[index]


def test_world_size_when_nproc_is_fixed() -> None:
    env = svc(rendered(settings(nproc_per_node=4, nnodes=3), 2, CPU_NODE))["environment"]
    assert env["WORLD_SIZE"] == "12"  # type: ignore[index]


def test_stack_limit_respects_a_lower_hard_limit() -> None:
    facts = CPU_NODE.model_copy(update={"stack_hard": 8 * 1024 * 1024})
    assert svc(rendered(settings(), 0, facts))["ulimits"]["stack"] == {"soft": 8388608, "hard": 8388608}  # type: ignore[index]


def test_module_command_and_debug_env() -> None:
    s = svc(rendered(settings(script=None, module="pkg.train", args=("--lr", "0.1")), 0, CPU_NODE, debug=True))
    assert s["command"] == ["-m", "pkg.train", "--lr", "0.1"]
    env = s["environment"]
    assert env["NCCL_DEBUG"] == "INFO" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"  # type: ignore[index]


def test_user_env_cannot_override_rank_variables() -> None:
    with pytest.raises(ValueError, match="NODE_RANK is set by nodekit itself"):
        settings(env={"NODE_RANK": "9", "NCCL_DEBUG": "WARN"})
    s = svc(rendered(settings(env={"NCCL_DEBUG": "WARN"}), 1, CPU_NODE))
    env = s["environment"]
    assert env["NODE_RANK"] == "1" and env["NCCL_DEBUG"] == "WARN"  # type: ignore[index]


def test_project_name_is_stable_per_rank() -> None:
    doc0 = yaml.safe_load(rendered(settings(), 0, CPU_NODE))
    doc1 = yaml.safe_load(rendered(settings(), 1, CPU_NODE))
    assert (doc0["name"], doc1["name"]) == ("nodekit-demo-node0", "nodekit-demo-node1")


def test_a_dotted_image_name_makes_a_project_name_compose_accepts() -> None:
    """Compose: 'must consist only of lowercase alphanumeric characters, hyphens, and underscores'. A project
    directory named model.v2 (or name = "model.v2") made every `up` fail."""
    doc = yaml.safe_load(rendered(settings(name="model.v2"), 0, CPU_NODE))
    assert doc["name"] == "nodekit-model_v2-node0" and re.fullmatch(r"[a-z0-9][a-z0-9_-]*", doc["name"])
    assert doc["services"]["train"]["labels"]["org.nodekit.name"] == "model.v2"


def test_the_image_id_reaches_the_stack_check_when_up_knows_it(tmp_path: Path) -> None:
    """Preflight compares NODEKIT_IMAGE_ID: `up` sets it, so the compared id is the image's, never empty."""
    from nodekit.launcher.config import parse_env
    from tests.factories import plan_here

    (tmp_path / "train.py").write_text("print(1)\n")
    s = Settings(project_dir=tmp_path, name="demo", script="train.py", nnodes=2)
    looked_up: list[str] = []

    def lookup(ref: str) -> str:
        looked_up.append(ref)
        return "sha256:" + "ab" * 32

    plan = plan_here(s, 1, "10.0.0.5", image="nodekit/demo:0123456789ab", facts=CPU_NODE, image_id=lookup)
    env = svc(plan.text)["environment"]
    assert looked_up == ["nodekit/demo:0123456789ab"]
    assert env["NODEKIT_IMAGE_ID"] == "sha256:" + "ab" * 32  # type: ignore[index]
    assert parse_env({k: str(v) for k, v in env.items()}).image_id == "sha256:" + "ab" * 32  # type: ignore[union-attr]
    plain = svc(plan_here(s, 1, "10.0.0.5", image="nodekit/demo:0123456789ab", facts=CPU_NODE).text)
    assert "NODEKIT_IMAGE_ID" not in plain["environment"]  # type: ignore[operator]


def test_a_start_never_pulls() -> None:
    """The image is nodekit's own build, shipped and checked by id before any start: a pull could only fail, later
    and from Docker Hub, where the missing image should be named ("a false already there")."""
    for rank, facts in ((0, CPU_NODE), (1, GPU_NODE)):
        assert svc(rendered(settings(), rank, facts))["pull_policy"] == "never"


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_every_dollar_is_written_for_compose_to_read_back_literally() -> None:
    """Each ``$`` in the file is doubled, so Compose substitutes nothing: args, env values, mount paths, labels,
    the template's own text. A pass_env name stays a key without a value (compose fills it, by design)."""
    text = rendered(settings(nproc_per_node=1, **DOLLARS), 0, CPU_NODE)
    s = svc(text)
    assert s["command"] == ["train.py", "--name", "exp-$$USER-$${RUN:-default}", "cost=$$HOME", "$$$$",
                            "a'b\"c d", "ünï", "tail\\"]  # fmt: skip
    env = s["environment"]
    assert isinstance(env, dict)
    assert env["EXPERIMENT"] == "exp-$$USER-$${RUN:-default}" and env["PRICE"] == "$$5 and $$$$"
    assert env["HF_TOKEN"] is None
    assert env["NODEKIT_DATA_CHECK"] == "/data/$$1 ü\\:sizes"
    mount = s["volumes"][1]  # type: ignore[index]
    assert (mount["source"], mount["target"]) == ("/srv/$$DATA/$${X:-y}", "/data/$$1 ü\\")
    for value in _strings(yaml.safe_load(text)):
        # Compose's reading of the file: "$$" is one literal "$"; a single "$" would start a substitution.
        assert "$" not in value.replace("$$", ""), value
