"""The prose names files that exist (issue 47): every repository path a doc page, the README or a docstring or
comment in nodekit/ names (``nodekit/...py``, ``tests/...py``, ``docs/...md``, ...), and every module file a
docstring of the launcher names by itself (``checks.py``, ``watchdog/``), is in the tree. A rename that leaves the
prose behind fails here, not in a reader's head."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOP = ("nodekit", "tests", "docs", "benchmarks", "images", "scripts", "examples")  # compose/ is a project's too
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./-]*\w\.(?:py|md|toml|sh|yaml))(?:::\w+)?")
LOCAL = re.compile(r"``([a-z_]+(?:\.py|/))``")


def _prose() -> list[Path]:
    return sorted(
        [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("compose/*.md"), *ROOT.glob("nodekit/**/*.py")]
    )


@pytest.mark.parametrize("path", _prose(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_the_prose_names_exists(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    missing = sorted({m.group(1) for m in PATH.finditer(text) if not (ROOT / m.group(1)).exists()})
    assert not missing, f"{path.relative_to(ROOT)} names files that are not in the tree: {missing}"


def test_the_launchers_docstring_names_its_own_modules() -> None:
    import nodekit.launcher

    here = Path(nodekit.launcher.__file__).parent
    named = set(LOCAL.findall(nodekit.launcher.__doc__ or ""))
    assert {"main.py", "contract.py", "watchdog/", "store/"} <= named
    assert not [n for n in named if not (here / n).exists()], named


MODULE = re.compile(r"(?<![\w./-])``([a-z_]+(?:/[a-z_]+)*\.py)``")
PROJECT_FILES = frozenset({"train.py", "trian.py"})  # a user's project's files, which the prose takes as examples


def missing_modules(path: Path) -> list[str]:
    """The ``name.py`` (or ``dir/name.py``) that the docstrings and comments of ``path`` name by itself and that is
    neither in its package nor in one above it, up to nodekit/ (a module names its neighbours so)."""
    nodekit = ROOT / "nodekit"
    packages = [p for p in path.parents if p == nodekit or nodekit in p.parents] + [ROOT]
    return sorted(
        {
            name
            for name in MODULE.findall(path.read_text(encoding="utf-8"))
            if name not in PROJECT_FILES and not any((p / name).exists() for p in packages)
        }
    )


@pytest.mark.parametrize("path", sorted(ROOT.glob("nodekit/**/*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_docstring_names_by_itself_exists(path: Path) -> None:
    assert missing_modules(path) == [], f"{path.relative_to(ROOT)} names modules that are not beside it"
