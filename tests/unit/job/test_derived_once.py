"""What every side derives from the job the same way is derived by one function: the preflight store's port
(``nodekit.launcher.contract.preflight_port_for``: the host's checks, the doctor, the fleet's plan, the launcher) and
a node's processes (``nodekit.job.spec.processes``: compose, the fleet's plan, Kubernetes). A second copy of either
drifts; these tests read the source for one and check the function's answers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from nodekit.job.spec import launch_spec, node_spec, processes
from nodekit.launcher.contract import PREFLIGHT_PORT_OFFSET, preflight_port_for
from nodekit.system.host.facts import HostFacts
from tests.factories import settings

ROOT = Path(__file__).resolve().parents[3] / "nodekit"


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_preflight_port_is_the_contracts_one_function() -> None:
    assert preflight_port_for(29500) == 29500 + PREFLIGHT_PORT_OFFSET
    # A subtraction is the master port's upper bound, which leaves room for the preflight port.
    adds = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _sources()
        if path != ROOT / "launcher" / "contract.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.BinOp)
        and not isinstance(node.op, ast.Sub)
        and "PREFLIGHT_PORT_OFFSET" in ast.unparse(node)
    ]
    assert adds == []


def test_a_nodes_processes_are_derived_by_one_function() -> None:
    assert [processes("auto", 0), processes("auto", 4), processes(3, 8)] == [1, 4, 3]
    one_per_gpu = re.compile(r"max\([^()]*gpu[^()]*,\s*1\)")
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in _sources()
        if p.parent.name != "launcher" and p != ROOT / "job" / "spec.py"
        for m in one_per_gpu.finditer(p.read_text())
    ]
    assert found == []
    s = settings(nnodes=2, nproc_per_node="auto")
    node = node_spec(s, launch_spec(s), 1, "10.0.0.1", HostFacts(gpu_count=0))
    assert node.nproc == 1
