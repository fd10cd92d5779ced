"""No test module imports another: what several test modules share is a builder in tests/factories.py (or a tier's
helpers.py, or tests/bad_input.py), or a fixture in a conftest.py. A test module that served as a fixture library
tied its tests to another file's, and ran that file's autouse fixtures where nobody asked for them.

Read from the syntax tree of every module under tests/ (nothing is imported), lazy imports inside functions
included."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def _is_test_module(dotted: str) -> bool:
    return dotted.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(source: str, package: str) -> list[str]:
    """Every test module (a module named test_*) that ``source``, a module of ``package``, imports, absolute or
    relative."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            if _is_test_module(base):
                found.append(base)
            found += [f"{base}.{a.name}" for a in node.names if _is_test_module(a.name)]
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders = {
        str(p.relative_to(TESTS.parent)): imported
        for p in sorted(TESTS.rglob("*.py"))
        if (imported := imported_test_modules(p.read_text(), ".".join(p.relative_to(TESTS.parent).parts[:-1])))
    }
    assert offenders == {}, "move what they share to tests/factories.py or a conftest.py"


def test_the_scan_sees_every_form_of_import() -> None:
    forms = [
        "from tests.unit.launcher.test_config import X",
        "import tests.unit.launcher.test_config",
        "from tests.unit.launcher import test_config",
        "from .test_layering import ROOT",
        "from . import test_layering",
        "def f():\n    from tests.cluster.test_ship import REF",
    ]
    harmless = "from tests.factories import LAUNCH_ENV\nfrom tests.cluster import helpers\nimport tests.golden\n"
    for form in forms:
        assert imported_test_modules(harmless + form + "\n", "tests.unit.meta"), form
    assert imported_test_modules(harmless, "tests.unit.meta") == []
