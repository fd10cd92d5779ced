"""The top-level compose/ holds the demo's node files exactly as nodekit renders them now (tests/compose_examples.py):
a change to rendering changes them, and `make docs` (python -m tests.compose_examples compose) writes them again."""

from __future__ import annotations

import pytest
import yaml

from tests import compose_examples

COMPOSE = compose_examples.ROOT / "compose"


@pytest.mark.parametrize("name", ["node-0.yaml", "node-1.yaml"])
def test_the_committed_node_file_is_what_nodekit_renders(name: str) -> None:
    rendered = compose_examples.files()
    assert sorted(rendered) == ["node-0.yaml", "node-1.yaml"]
    assert (COMPOSE / name).read_text(encoding="utf-8") == rendered[name], (
        f"compose/{name} differs from what nodekit renders: run `make docs` (python -m tests.compose_examples "
        "compose) and commit"
    )


def test_the_two_files_are_one_job_of_two_nodes() -> None:
    docs = {r: yaml.safe_load((COMPOSE / f"node-{r}.yaml").read_text())["services"]["train"] for r in (0, 1)}
    env = {r: d["environment"] for r, d in docs.items()}
    assert [env[r]["NODE_RANK"] for r in (0, 1)] == ["0", "1"]
    assert env[0]["MASTER_ADDR"] == env[1]["MASTER_ADDR"] == compose_examples.MAIN
    assert env[0]["NODEKIT_JOB_SECRET"] == env[1]["NODEKIT_JOB_SECRET"]
    assert docs[0]["image"] == docs[1]["image"] == compose_examples.IMAGE
    assert (COMPOSE / "README.md").is_file()
