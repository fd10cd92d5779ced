"""The heavy tiers' grouping for `make test` (tests/conftest.py): every real-engine test in one group, the cluster
tests in three others (those over real SSH, Slurm's, and the rest), each with its own cluster name, so they run side
by side while the tests inside each stay serial."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import (
    CLUSTER_NAMES,
    GROUP_ORDER,
    SLURM_GROUP,
    SSH_ELSEWHERE,
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


def test_every_cluster_test_over_ssh_is_placed_counts_only_its_own_and_own_clusters_have_names_of_their_own() -> None:
    """Every file that starts sshds or ssh clients is placed (the SSH group, or beside it for balance), and none
    counts nodekit's scratch machine-wide: groups run side by side, and a glob of every ``nkssh.*`` in /tmp saw
    another group's (the CI failure of ecabdca). A cluster a test brings up itself must not share a name
    (namespaces, data root) with a group's cluster or another test's."""
    sources = {f.name: f.read_text() for f in sorted((ROOT / "tests" / "cluster").glob("test_*.py"))}
    over_ssh = {name for name, text in sources.items() if re.search(r"ssh_client\(|start_sshd\(|: Fleet\b", text)}
    assert over_ssh == SSH_GROUP | SSH_ELSEWHERE and not SSH_GROUP & SSH_ELSEWHERE
    helpers = (ROOT / "tests" / "cluster" / "helpers.py").read_text()
    machine_wide = r'Path\("/tmp"\)\.glob\(f?"(nkssh|nkalive|nodekit-relay)\.\*"\)'
    assert [n for n, text in {**sources, "helpers.py": helpers}.items() if re.search(machine_wide, text)] == []
    own = [m for text in sources.values() for m in re.findall(r'Cluster\(\d+, name="(\w+)"', text)]
    assert own and len(own) == len(set(own)) and not set(own) & set(CLUSTER_NAMES.values()), own


def test_the_groups_go_out_longest_first_and_every_group_is_ranked(tmp_path: Path) -> None:
    """GROUP_ORDER decides which worker gets which group: on two real xdist workers the first group each starts is
    the SSH group or the engine's, and Slurm's comes last (in collection order it would be the engine's and the
    other cluster tests' first). A group left out of GROUP_ORDER would go last whatever its size."""
    files = sorted((ROOT / "tests").glob("*/test_*.py"))
    groups = {group_of(f"{f.relative_to(ROOT).as_posix()}::test_x") for f in files} - {None}
    assert groups == set(GROUP_ORDER) and group_rank(None) == len(GROUP_ORDER)
    for path in (
        "integration/test_two_node.py",
        "cluster/test_e2e.py",
        "cluster/test_fleet.py",
        "cluster/test_slurm.py",
    ):
        test = tmp_path / "tests" / path
        test.parent.mkdir(parents=True, exist_ok=True)
        test.write_text("import time\n" + "".join(f"def test_{i}():\n    time.sleep(0.3)\n" for i in range(4)))
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.conftest import pytest_xdist_make_scheduler\n"
    )
    ran = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                          "-v", "-c", "/dev/null", "--rootdir", str(tmp_path), "tests"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    order = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED tests/(\w+/test_\w+)\.py", ran.stdout, re.M)
    firsts = {worker: next(test for w, test in order if w == worker) for worker in ("gw0", "gw1")}
    assert set(firsts.values()) == {"cluster/test_fleet", "integration/test_two_node"}, ran.stdout
    assert order[-1][1] in ("cluster/test_slurm", "cluster/test_e2e"), ran.stdout
