"""The Makefile is the single entry point: every declared target has a rule, and `make help` lists exactly them."""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[3] / "Makefile"


def _phony() -> set[str]:
    line = next(x for x in MAKEFILE.read_text().splitlines() if x.startswith(".PHONY:"))
    return set(line.split(":", 1)[1].split())


def test_every_declared_target_has_a_rule() -> None:
    rules = set(re.findall(r"^([a-z][\w-]*):", MAKEFILE.read_text(), flags=re.M))
    assert _phony() - rules == set()


def test_help_lists_every_target_but_itself() -> None:
    listed = set(re.findall(r'@echo "make ([\w-]+) ', MAKEFILE.read_text()))
    assert listed == _phony() - {"help"}
