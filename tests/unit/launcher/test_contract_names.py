"""Every name the host side and the launcher share is written once, in nodekit/launcher/contract.py (issue 29): the
variables, the labels, the container's paths and the launch modes. Before, ``org.nodekit.rank`` was written in two
backends, the modes in three modules, and each variable name on both sides of the boundary."""

from __future__ import annotations

import ast
from pathlib import Path

from nodekit.launcher import contract
from nodekit.launcher.plan import STYLES

ROOT = Path(__file__).resolve().parents[3] / "nodekit"
CONTRACT = ROOT / "launcher" / "contract.py"


def shared_names() -> dict[str, str]:
    """Each value the contract names (a variable, a label, a path), with where it is written."""
    names = {contract.OUTPUT_DIR: "OUTPUT_DIR", contract.WORKDIR: "WORKDIR"}
    for cls in (contract.Env, contract.Label):
        names |= {v: f"{cls.__name__}.{k}" for k, v in vars(cls).items() if not k.startswith("_")}
    return names


def duplicates(path: Path, names: dict[str, str], modes: frozenset[str]) -> list[str]:
    """The literals in ``path`` that write a contract name out again: any string equal to a variable, label or path
    of the contract; a launch mode where it is compared with a mode or listed in a Literal (the mode names are
    common words elsewhere: the program torchrun, a dict key "env")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts: list[ast.Constant] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{node.lineno}: {node.value!r} is contract.{names[node.value]}")
        if isinstance(node, ast.Compare) and any(w in ast.unparse(node) for w in ("launcher", "mode")):
            consts = [c for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
            consts += [e for c in node.comparators if isinstance(c, ast.Tuple | ast.Set) for e in c.elts
                       if isinstance(e, ast.Constant)]  # fmt: skip
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            consts = [e for e in ast.walk(node.slice) if isinstance(e, ast.Constant)]
        found += [
            f"{c.lineno}: launch mode {c.value!r} is in contract.LAUNCH_MODES" for c in consts if c.value in modes
        ]
    return found


def test_no_module_writes_a_contract_name_out_again() -> None:
    names, modes = shared_names(), frozenset(contract.LAUNCH_MODES)
    found = [
        f"{p.relative_to(ROOT.parent)}:{line}"
        for p in sorted(ROOT.rglob("*.py"))
        if p != CONTRACT
        for line in duplicates(p, names, modes)
    ]
    assert found == []


def test_the_scan_finds_each_kind_of_duplicate(tmp_path: Path) -> None:
    """The checker itself: a variable name, a label, a compared mode and a Literal of modes are each found; a
    mode name used as something else (a program, a key) is not."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import Literal\n"
        'a = {"NODE_RANK": "1"}\n'
        'b = "org.nodekit.rank"\n'
        'if launcher == "fabric":\n    pass\n'
        'Kind = Literal["torchrun", "env"]\n'
        'argv = ["torchrun", "--nnodes"]\n'
        'opts = {"env": {}}\n'
    )
    found = duplicates(module, shared_names(), frozenset(contract.LAUNCH_MODES))
    assert sorted(int(f.split(":")[0]) for f in found) == [2, 3, 4, 6, 6]


def test_every_launch_mode_has_a_style_and_every_style_a_mode() -> None:
    assert set(STYLES) == set(contract.LAUNCH_MODES)
    assert contract.DEFAULT_LAUNCH_MODE in contract.LAUNCH_MODES


def test_the_container_labels_and_variables_come_from_the_contract() -> None:
    """What a rank's container carries is spelled by the contract's names (a rename there renames it everywhere)."""
    from nodekit.config.settings import Settings
    from nodekit.job.container import RANK
    from nodekit.job.plan import plan_container
    from nodekit.job.spec import launch_spec, node_spec
    from nodekit.system.host.facts import HostFacts

    s = Settings(project_dir=Path("/p"), name="demo", script="train.py", nnodes=2)
    spec = plan_container(node_spec(s, launch_spec(s), 1, None, HostFacts()), HostFacts(), image="i", output_dir="/o")
    assert (contract.Label.RANK, RANK) in spec.labels
    assert {v.name for v in spec.env} >= {contract.Env.MASTER_ADDR, contract.Env.NODE_RANK, contract.Env.LAUNCHER}
