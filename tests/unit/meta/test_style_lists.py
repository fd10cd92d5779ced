"""Prose that lists the launch styles lists every one (issue 47): a paragraph, table or comment of the docs, the
README, an example or a module of nodekit/ that names three styles or more names them all, and the settings'
description of ``launcher`` (the config reference, the CLI's help) and the starter nodekit.toml are generated from
``nodekit.launcher.plan.STYLES``. A new style that the prose leaves out fails here, not in a reader's head."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodekit.config.settings import Settings
from nodekit.config.starter import starter_config
from nodekit.launcher.contract import LAUNCH_MODES
from nodekit.launcher.plan import STYLES

ROOT = Path(__file__).resolve().parents[3]


def _prose() -> list[Path]:
    return sorted(
        [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("compose/*.md"), *ROOT.glob("nodekit/**/*.py"),
         *ROOT.glob("examples/**/*.md"), *ROOT.glob("examples/**/*.toml")]
    )  # fmt: skip


def named_styles(block: str) -> set[str]:
    """The styles ``block`` names as a value: in backticks or quotes (``"env"``, `` `mpirun` ``), the way a list of
    them is written; a bare word (the program torchrun, an environment) is not counted."""
    return {m for m in LAUNCH_MODES if re.search(r"[`\"']" + re.escape(m) + r"[`\"']", block)}


def incomplete_lists(text: str) -> list[str]:
    """Each block of ``text`` (between blank lines) that names three styles or more but not every one: its start
    and what it leaves out."""
    found = []
    for block in re.split(r"\n[ \t#]*\n", text):
        named = named_styles(block)
        if len(named) >= 3 and named != set(LAUNCH_MODES):
            found.append(f"{block.strip()[:80]!r} leaves out {sorted(set(LAUNCH_MODES) - named)}")
    return found


@pytest.mark.parametrize("path", _prose(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_list_of_launch_styles_is_complete(path: Path) -> None:
    assert incomplete_lists(path.read_text(encoding="utf-8")) == []


def test_the_generated_lists_name_every_style() -> None:
    assert list(STYLES) == list(LAUNCH_MODES)
    description = Settings.model_fields["launcher"].description or ""
    assert all(f"{m}: {STYLES[m].says}" in description for m in LAUNCH_MODES), description
    assert named_styles(starter_config("demo")) == set(LAUNCH_MODES)


def test_the_check_finds_a_short_list_and_passes_a_mention() -> None:
    assert incomplete_lists("Launchers `torchrun`, `fabric` and `env` do this.\n") != []
    assert incomplete_lists("torchrun runs the env's script; `fabric` sets LT_*.\n") == []
