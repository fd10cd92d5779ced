"""Which packages may import what: the layering README.md, STYLE.md and docs/architecture.md describe.

Read from the AST of every module under nodekit/ (nothing is imported or run), lazy imports inside functions
included. The rules:

- the launcher (nodekit/launcher/, run inside the image) imports the standard library, torch, its own package and
  the import-free ``nodekit`` package only: nothing host-side;
- ``nodekit/__init__.py`` imports nothing (it is copied into the image beside the launcher);
- only nodekit/system/docker/ imports python_on_whales; only nodekit/cli/ imports rich and typer; only the launcher
  torch;
- nothing imports nodekit.cli but the CLI itself and ``nodekit/__main__.py`` (``python -m nodekit``);
- no import cycles between nodekit's modules (imports under ``if TYPE_CHECKING:`` never run and are left out).

docs/architecture.md states these rules; the last test here also holds it to naming only modules that exist.

Where processes may start (nodekit/system/proc/ and the launcher) is tests/unit/system/test_proc.py's rule.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "nodekit"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports: a module when one by that name exists, else the name as written
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(body: list[ast.stmt], typing_only: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    for node in body:
        yield node, typing_only
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from _statements(node.body, True)
            yield from _statements(node.orelse, typing_only)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, []):
                if isinstance(child, ast.stmt):
                    yield from _statements([child], typing_only)
                elif isinstance(child, ast.excepthandler | ast.match_case):
                    yield from _statements(child.body, typing_only)


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> list[Import]:
    """Every import statement in the module ``name`` (at ``path``), lazy ones included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node, typing_only in _statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found += [Import(name, a.name, node.lineno, typing_only) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for a in node.names:
                target = f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                found.append(Import(name, target, node.lineno, typing_only))
    return found


def all_imports(root: Path = ROOT) -> list[Import]:
    known = modules(root)
    return [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def _top(target: str) -> str:
    return target.split(".", 1)[0]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def cycles(imports: list[Import], known: Mapping[str, Path]) -> list[list[str]]:
    """The strongly connected groups of more than one module in the graph of runtime imports (Tarjan)."""
    graph: dict[str, set[str]] = {m: set() for m in known}
    for imp in imports:
        if not imp.typing_only and imp.target in known and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                groups.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


LAYERS = (
    ("nodekit.cli",),
    ("nodekit.backends",),
    ("nodekit.data",),
    ("nodekit.runs",),
    ("nodekit.doctor",),
    ("nodekit.job",),
    ("nodekit.ship",),
    ("nodekit.image",),
    ("nodekit.config",),
    ("nodekit.system",),
    ("nodekit.errors", "nodekit.launcher", "nodekit"),
)
"""The concepts of ``ls nodekit/``, top floor first: a module imports its own concept or those on lower floors,
never one above (a backend uses the job; the job never names a backend)."""


def floor(module: str) -> int | None:
    """The floor of ``module`` in :data:`LAYERS` (0 is the top); None for what is not nodekit's."""
    best: tuple[int, int] | None = None
    for level, packages in enumerate(LAYERS):
        for package in packages:
            if _within(module, package) and (best is None or len(package) > best[1]):
                best = (level, len(package))
    return best[0] if best else None


def violations(imports: list[Import]) -> list[str]:
    """Each import that breaks a rule of the module docstring (cycles apart), as ``module:line -> target``."""
    only_in = {"python_on_whales": "nodekit.system.docker", "rich": "nodekit.cli", "typer": "nodekit.cli"}
    only_in["torch"] = "nodekit.launcher"
    bad = []
    for imp in imports:
        where, top = f"{imp.module}:{imp.line} -> {imp.target}", _top(imp.target)
        if top in only_in and not _within(imp.module, only_in[top]):
            bad.append(f"{where} (only {only_in[top]} may import {top})")
        if _within(imp.module, "nodekit.launcher"):
            host_side = top == "nodekit" and imp.target != "nodekit" and not _within(imp.target, "nodekit.launcher")
            third_party = top not in ("nodekit", "torch") and top not in sys.stdlib_module_names
            if host_side or third_party:
                bad.append(f"{where} (the launcher runs in the image: standard library, torch and itself only)")
        if imp.module == "nodekit":
            bad.append(f"{where} (nodekit/__init__.py is copied into the image and imports nothing)")
        here, there = floor(imp.module), floor(imp.target)
        # The launcher's and the CLI's own rules below say more for their imports.
        own_rule = _within(imp.module, "nodekit.launcher") or _within(imp.target, "nodekit.cli")
        if here is not None and there is not None and there < here and not own_rule:
            bad.append(
                f"{where} (a lower floor imports a higher one: {LAYERS[here][0]} may not use {LAYERS[there][0]})"
            )
        cli_user = _within(imp.module, "nodekit.cli") or imp.module == "nodekit.__main__"
        if _within(imp.target, "nodekit.cli") and not cli_user:
            bad.append(f"{where} (nothing below the CLI imports it)")
    return bad


def test_nodekit_keeps_its_layers() -> None:
    imports = all_imports()
    assert len({i.module for i in imports}) > 50  # the walk found the package
    assert violations(imports) == []


def test_nodekit_has_no_import_cycles() -> None:
    assert cycles(all_imports(), modules(ROOT)) == []


# --- the checker itself, on small trees that break each rule --------------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, text in {"__init__.py": "", **files}.items():
        path = tmp_path / "nodekit" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "nodekit"


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"launcher/__init__.py": "", "launcher/main.py": "from nodekit.job.spec import X\n"}, "the launcher runs"),
        ({"launcher/__init__.py": "", "launcher/main.py": "def f():\n    import yaml\n"}, "the launcher runs"),
        (
            {"settings.py": "", "launcher/__init__.py": "", "launcher/m.py": "from .. import settings\n"},
            "launcher runs",
        ),
        ({"render.py": "import python_on_whales\n"}, "only nodekit.system.docker may import python_on_whales"),
        ({"node.py": "try:\n    from rich import print\nexcept ImportError:\n    pass\n"}, "only nodekit.cli"),
        ({"spec.py": "import typer\n"}, "only nodekit.cli may import typer"),
        ({"host/__init__.py": "", "host/gpu.py": "import torch\n"}, "only nodekit.launcher may import torch"),
        ({"cli/__init__.py": "", "cli/app.py": "", "node.py": "def f():\n    from nodekit.cli import app\n"}, "CLI"),
        ({"__init__.py": "import os\n"}, "imports nothing"),
        ({"system/__init__.py": "", "system/files.py": "from nodekit.config import settings\n"}, "a lower floor"),
        ({"job/__init__.py": "", "job/plan.py": "def f():\n    from nodekit.backends import compose\n"}, "lower"),
    ],
)
def test_the_checker_finds_each_broken_rule(tmp_path: Path, files: dict[str, str], needle: str) -> None:
    found = violations(all_imports(_tree(tmp_path, files)))
    assert len(found) == 1 and needle in found[0], found


def test_the_checker_allows_what_the_rules_allow(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "launcher/__init__.py": "import os\nimport nodekit\n",
            "launcher/main.py": "import torch\nfrom nodekit.launcher import config\nfrom . import config as c\n",
            "launcher/config.py": "",
            "system/__init__.py": "",
            "system/docker/__init__.py": "import python_on_whales\n",
            "cli/__init__.py": "",
            "cli/app.py": "import rich\nimport typer\nfrom nodekit.cli import common\n",
            "cli/common.py": "from nodekit import launcher\n",
            "__main__.py": "from nodekit.cli.app import main\n",
        },
    )
    assert violations(all_imports(root)) == []


def test_the_checker_finds_a_cycle_even_through_a_lazy_import_but_not_through_type_checking(tmp_path: Path) -> None:
    lazy = _tree(tmp_path / "a", {"x.py": "from nodekit import y\n", "y.py": "def f():\n    from nodekit.x import g\n"})
    assert cycles(all_imports(lazy), modules(lazy)) == [["nodekit.x", "nodekit.y"]]
    typing = _tree(
        tmp_path / "b",
        {
            "x.py": "from nodekit import y\n",
            "y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import nodekit.x\n",
        },
    )
    assert cycles(all_imports(typing), modules(typing)) == []


def test_the_architecture_page_names_only_modules_that_exist() -> None:
    """docs/architecture.md stays true as modules move: every ``something.py`` it names is a file of the repo."""
    repo = ROOT.parent
    files = {str(p.relative_to(repo)) for top in ("nodekit", "tests") for p in (repo / top).rglob("*.py")}
    named = set(re.findall(r"[\w./]+\.py\b", (repo / "docs" / "architecture.md").read_text()))
    missing = {n for n in named if not any(f == n or f.endswith("/" + n) for f in files)}
    assert len(named) > 20 and missing == set()


def room_cycles(imports: list[Import], known: Mapping[str, Path]) -> dict[str, list[list[str]]]:
    """Per package, the circles among its rooms: each module or subpackage directly inside it is one room, and an
    import between two modules of the package is an arrow between their rooms (lazy and ``TYPE_CHECKING`` imports
    included: a reader follows those too). A circle of rooms is an arrow that runs back up in the structure's
    drawing, at that folder's level; ``{package: [[room, ...], ...]}``, only packages with a circle."""
    packages = {m for m, p in known.items() if p.name == "__init__.py"}
    found: dict[str, list[list[str]]] = {}
    for package in sorted(packages):

        def room(module: str, package: str = package) -> str | None:
            if module == package:
                return f"{package}.__init__"
            if not _within(module, package):
                return None
            return package + "." + module[len(package) + 1 :].split(".", 1)[0]

        rooms = {r for m in known if (r := room(m)) is not None}
        arrows = []
        for imp in imports:
            a, b = room(imp.module), room(imp.target) if imp.target in known else None
            if a is not None and b is not None and a != b:
                arrows.append(Import(a, b, imp.line, False))
        groups = cycles(arrows, dict.fromkeys(rooms, Path()))
        if groups:
            found[package] = groups
    return found


def test_no_folder_has_a_circle_of_rooms() -> None:
    """The structure drawing's rule, at every level: inside nodekit/ and inside each of its folders (launcher/,
    ship/, ...), no two rooms import each other, directly or round a loop, not even for types only. So every arrow
    between rooms runs down: a newcomer reads a folder from the top room to the bottom without climbing back."""
    assert room_cycles(all_imports(), modules(ROOT)) == {}


def test_the_room_check_finds_a_circle_between_folders_and_a_type_only_one(tmp_path: Path) -> None:
    folders = _tree(
        tmp_path / "a",
        {"x/__init__.py": "", "x/a.py": "from nodekit.y import b\n", "y/__init__.py": "", "y/b.py": "def f():\n"
         "    from nodekit.x import c\n", "x/c.py": ""},
    )  # fmt: skip
    assert room_cycles(all_imports(folders), modules(folders)) == {"nodekit": [["nodekit.x", "nodekit.y"]]}
    typing = _tree(
        tmp_path / "b",
        {
            "s/__init__.py": "",
            "s/p.py": "from nodekit.s import q\n",
            "s/q.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nodekit.s.p import T\n",
        },
    )
    assert room_cycles(all_imports(typing), modules(typing)) == {"nodekit.s": [["nodekit.s.p", "nodekit.s.q"]]}
