"""The heavy tiers' grouping for `make test` (tests/conftest.py): every real-engine test in one group, the cluster
tests in three others (those over real SSH, Slurm's, and the rest), each with its own cluster name, so they run side
by side while the tests inside each stay serial."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import (
    CLUSTER_NAMES,
    GROUP_ORDER,
    SLURM_GROUP,
    SSH_GROUP,
    cluster_name,
    group_of,
    group_rank,
    tier_of,
)

ROOT = Path(__file__).resolve().parents[3]


def test_each_heavy_test_file_has_its_tier_and_unit_tests_have_none() -> None:
    for tier, folder in (("engine", "integration"), ("cluster", "cluster")):
        files = sorted((ROOT / "tests" / folder).glob("test_*.py"))
        assert files
        assert {tier_of(f"{f.relative_to(ROOT).as_posix()}::test_x[a@b]") for f in files} == {tier}
    assert (
        tier_of("tests/unit/meta/test_tiers.py::test_each_heavy_test_file_has_its_tier_and_unit_tests_have_none")
        is None
    )


def test_the_cluster_tier_runs_as_three_groups_each_with_its_own_cluster_name() -> None:
    files = sorted((ROOT / "tests" / "cluster").glob("test_*.py"))
    groups = {f.name: group_of(f"{f.relative_to(ROOT).as_posix()}::test_x") for f in files}
    assert set(groups.values()) == {"cluster", "cluster-ssh", "cluster-slurm"}
    assert {name for name, group in groups.items() if group == "cluster-ssh"} == SSH_GROUP
    assert {name for name, group in groups.items() if group == "cluster-slurm"} == SLURM_GROUP
    assert group_of("tests/integration/test_two_node.py::test_x") == "engine"
    assert group_of("tests/unit/meta/test_tiers.py::test_x") is None
    names = {cluster_name(f"tests/cluster/{name}::test_x") for name in groups}
    assert names == set(CLUSTER_NAMES.values()) and len(names) == 3


def test_every_cluster_test_over_ssh_is_in_the_ssh_group_and_own_clusters_have_names_of_their_own() -> None:
    """The SSH group's tests count the machine's ssh processes and /tmp entries: a file that starts sshds or ssh
    clients outside the group would run beside them (3 workers) and spoil their counts. A cluster a test brings up
    itself must not share a name (namespaces, data root) with a group's cluster or another test's."""
    sources = {f.name: f.read_text() for f in sorted((ROOT / "tests" / "cluster").glob("test_*.py"))}
    over_ssh = {name for name, text in sources.items() if re.search(r"ssh_client\(|start_sshd\(|: Fleet\b", text)}
    assert over_ssh == SSH_GROUP
    own = [m for text in sources.values() for m in re.findall(r'Cluster\(\d+, name="(\w+)"', text)]
    assert own and len(own) == len(set(own)) and not set(own) & set(CLUSTER_NAMES.values()), own


def test_the_groups_go_out_longest_first_and_every_group_is_ranked() -> None:
    """GROUP_ORDER decides which worker gets which group (pytest_collection_modifyitems sorts by it): a group left
    out of it would go last whatever its size."""
    files = sorted((ROOT / "tests").glob("*/test_*.py"))
    groups = {group_of(f"{f.relative_to(ROOT).as_posix()}::test_x") for f in files} - {None}
    assert groups == set(GROUP_ORDER)
    paths = ("cluster/test_fleet.py", "integration/test_two_node.py", "cluster/test_e2e.py", "cluster/test_slurm.py")
    ranks = [group_rank(f"tests/{path}::test_x") for path in paths]
    assert ranks == [0, 1, 2, 3]
    assert group_rank("tests/unit/meta/test_tiers.py::test_x") == len(GROUP_ORDER)
