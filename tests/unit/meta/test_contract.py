"""The values host side and launcher must agree on are written once, in nodekit/launcher/contract.py.

The launcher's exit codes, the preflight port offset and the Docker pidfiles are named, never written out again
(``EXIT_PEER_LOST = 19`` in a second module, ``master_port + 1`` by hand): a change made in one place would leave the
others disagreeing with the launcher in the image.
"""

from __future__ import annotations

import ast
from pathlib import Path

from nodekit.launcher import contract

ROOT = Path(__file__).resolve().parents[3] / "nodekit"
SHARED = set(contract.__all__)


def test_no_module_but_the_contract_assigns_a_shared_name() -> None:
    redefined = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "launcher" / "contract.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for t in targets:
                if isinstance(t, ast.Name) and t.id in SHARED:
                    redefined.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {t.id}")
    assert redefined == []


def test_the_contract_is_standard_library_only_and_imports_nothing_of_nodekit() -> None:
    tree = ast.parse((ROOT / "launcher" / "contract.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported == ["__future__"]


def test_both_sides_read_the_same_values() -> None:
    from nodekit.backends.fleet import remote, supervise
    from nodekit.backends.k8s import render as k8s
    from nodekit.backends.slurm import render
    from nodekit.launcher import config, main
    from nodekit.launcher.watchdog import run as watchdog

    assert main.EXIT_PEER_LOST == watchdog.EXIT_PEER_LOST == supervise.EXIT_PEER_LOST == render.EXIT_PEER_LOST == 19
    assert k8s.FAIL_JOB_EXIT_CODES == (2, 17, 19, 20, 21, 22)
    assert f"PIDFILES='{' '.join(contract.DOCKER_PIDFILES)}'" in remote.facts_script()
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0", "NNODES": "2", "NPROC_PER_NODE": "1"}
    assert config.parse_env(env).preflight_port == 29500 + contract.PREFLIGHT_PORT_OFFSET == 29501
