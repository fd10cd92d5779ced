"""The reference pages are the code's: docs/reference/*.md must be what nodekit/cli/reference.py writes now (a new
flag, setting or exit code changes them; `make docs` writes them again), and they must cover everything."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import typer.main
from pydantic import BaseModel

from nodekit.cli import reference
from nodekit.cli.app import app
from nodekit.config.settings import Settings
from nodekit.launcher import contract

DOCS = Path(__file__).resolve().parents[3] / "docs" / "reference"


@pytest.mark.parametrize("page", reference.PAGES)
def test_the_reference_on_disk_is_what_the_code_says(page: str) -> None:
    written = (DOCS / page).read_text(encoding="utf-8")
    assert written == reference.pages()[page], (
        f"docs/reference/{page} differs from the code: run `make docs` (python -m nodekit.cli.reference) and commit"
    )


def test_every_command_option_setting_and_exit_code_is_in_the_reference() -> None:
    pages = reference.pages()
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        assert f"## nodekit {name}\n" in pages["cli.md"], name
        for param in cmd.params:
            for opt in param.opts:
                if opt.startswith("-"):
                    assert opt in pages["cli.md"], f"nodekit {name} {opt}"
    for key in Settings.model_fields:
        if key != "project_dir":
            assert f"| `{key}` |" in pages["config.md"], key
    for name, value, meaning in reference.exit_codes(Path(contract.__file__).read_text()):
        assert getattr(contract, name) == value
        assert meaning, f"{name} has no comment in contract.py saying what it means"
        assert f"| {value} | `{name}` | {meaning}" in pages["exit-codes.md"]
    assert {n for n in vars(contract) if n.startswith("EXIT_")} == {
        n for n, _, _ in reference.exit_codes(Path(contract.__file__).read_text())
    }


def test_exit_codes_are_read_with_their_comments() -> None:
    source = "EXIT_A = 3  # three things\nOTHER = 4  # not an exit code\nEXIT_B = 5\n"
    assert reference.exit_codes(source) == [("EXIT_A", 3, "three things"), ("EXIT_B", 5, "")]


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def test_every_table_of_the_settings_model_has_its_section_with_every_key() -> None:
    """Issue 47: the generator kept its own list of tables, and [health] and [notify] were missing from the page.
    Every field of Settings that holds a model (a table, an array of tables, a table of tables) has a section
    named after the field, listing every key of that model."""
    page = reference.pages()["config.md"]
    sections = {line.removeprefix("## ") for line in page.splitlines() if line.startswith("## [")}
    tables = {name: _models_in(field.annotation) for name, field in Settings.model_fields.items()}
    tables = {name: models for name, models in tables.items() if models}
    assert {"health", "notify", "slurm", "k8s", "mounts", "nodes"} <= set(tables)
    for name, (model,) in tables.items():
        (section,) = [s for s in sections if s.strip("[]").split(".")[0] == name]
        body = page.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        for key in model.model_fields:
            assert f"| `{key}` |" in body, f"{section} {key}"
