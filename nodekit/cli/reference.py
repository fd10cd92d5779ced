"""The reference pages of the documentation, generated from the code so that they cannot drift from it.

``python -m nodekit.cli.reference docs/reference`` (``make docs`` runs it) writes:

- ``cli.md``: every command and its arguments and options, from the typer app (help, type, default);
- ``config.md``: every ``nodekit.toml`` key, table by table, from the settings models (type, default, description,
  the ``NODEKIT_*`` variable);
- ``exit-codes.md``: the launcher's exit codes from ``nodekit/launcher/contract.py`` (each constant's comment is its
  meaning) and the CLI's from the error tree (``nodekit/errors.py``).

tests/unit/cli/test_reference.py fails when a page on disk differs from what this module writes now.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import re
import sys
import tokenize
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGES = ("cli.md", "config.md", "exit-codes.md")
HEADER = "<!-- Generated from the code by `python -m nodekit.cli.reference` (make docs). Do not edit. -->"


def _text(text: str) -> str:
    """Prose for markdown: ``<suite>`` stays visible (not read as an HTML tag)."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: str) -> str:
    return _text(" ".join(re.sub(r"\s*\[default: [^\]]*\]", "", text).split())).replace("|", "\\|")


# ---- the command line ----------------------------------------------------------------------------------------


def _default(param: Any) -> str:
    default = param.default
    if callable(default) or default is None or default is False or default in ((), []):
        return ""
    return "on" if default is True else f"`{default}`"


def cli_page() -> str:
    from nodekit.cli.app import app
    from nodekit.cli.common import command_order

    group: Any = typer.main.get_command(app)
    ctx = typer.Context(group, info_name="nodekit")
    names = command_order(group.commands)
    out = [
        "# Command line",
        "",
        HEADER,
        "",
        "Every command, with its arguments and options as `nodekit COMMAND --help` prints them. Options that plan "
        "the job (`--nnodes`, `--nproc-per-node`, `--master-port`, `--script`) and the script's arguments after "
        "`--` mean the same on every command that takes them; they override `nodekit.toml` and `NODEKIT_*` "
        "variables ([configuration](config.md)).",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    for name in names:
        first = inspect.cleandoc(group.commands[name].help or "").split("\n\n")[0]
        out.append(f"| [`nodekit {name}`](#nodekit-{name}) | {_cell(first)} |")
    for name in names:
        out += _command(group.commands[name], name, ctx)
    return "\n".join(out) + "\n"


def _command(cmd: Any, name: str, parent: Any) -> list[str]:
    ctx = typer.Context(cmd, info_name=name, parent=parent)
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out = ["", f"## nodekit {name}", "", "```", f"nodekit {name} {usage}".rstrip(), "```", ""]
    out += [_text(inspect.cleandoc(cmd.help or "")), ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False)]
    args = [p for p in params if p.param_type_name == "argument"]
    opts = [p for p in params if p.param_type_name == "option"]
    if args:
        out += ["| argument | description |", "| --- | --- |"]
        for a in args:
            shown, helptext = a.get_help_record(ctx) or (a.name, "")
            many = "..." if a.nargs == -1 else ""
            out.append(f"| `{shown.split(' ')[0]}{many}` | {_cell(helptext)} |")
        out.append("")
    if opts:
        out += ["| option | default | description |", "| --- | --- | --- |"]
        for o in opts:
            shown, helptext = o.get_help_record(ctx) or (", ".join(o.opts), "")
            out.append(f"| `{shown}` | {_default(o)} | {_cell(helptext)} |")
    return out


# ---- nodekit.toml --------------------------------------------------------------------------------------------


def _annotation(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _annotation(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_annotation(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" (optional)" if type(None) in args else "")
    if origin in (tuple, list):
        return f"list of {_annotation(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_annotation(args[0])} → {_annotation(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return {"str": "string", "int": "integer", "bool": "boolean", "Path": "path", "float": "number"}.get(
        getattr(annotation, "__name__", str(annotation)), getattr(annotation, "__name__", str(annotation))
    )


def _toml(value: Any) -> str:
    """A default as it is written in nodekit.toml."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _field_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return "" if isinstance(made, BaseModel) or not made else f"`{_toml(made)}`"
    default = field.default
    if default is PydanticUndefined:
        return "required"
    if default is None or default == ():
        return ""
    return f"`{_toml(default)}`"


def _table(model: type[BaseModel], env_prefix: str | None) -> list[str]:
    head = "| key | type | default | description |" + (" variable |" if env_prefix else "")
    rule = "| --- | --- | --- | --- |" + (" --- |" if env_prefix else "")
    out = [head, rule]
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        described = _cell(field.description or "")
        row = f"| `{name}` | {_annotation(field.annotation)} | {_field_default(field)} | {described} |"
        if env_prefix:
            row += f" `{env_prefix}{name.upper()}` |"
        out.append(row)
    return out


def tables(model: type[BaseModel]) -> list[tuple[str, type[BaseModel], str]]:
    """Every table of ``model`` as nodekit.toml writes it (``[slurm]``, ``[[mounts]]``, ``[nodes.R]``), its model
    and the first paragraph of that model's docstring: derived from the fields, so a new table is documented by
    being declared."""
    found = []
    for name, field in model.model_fields.items():
        annotation, args = field.annotation, typing.get_args(field.annotation)
        origin = typing.get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            title, table = f"[{name}]", annotation
        elif origin in (tuple, list) and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            title, table = f"[[{name}]]", args[0]
        elif origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            title, table = f"[{name}.{'R' if args[0] is int else 'NAME'}]", args[1]
        else:
            continue
        intro = inspect.cleandoc(table.__doc__ or "").split("\n\n")[0].replace("\n", " ").replace("``", "`")
        intro = re.sub(r"^`\[\[?[\w.]+\]\]?`: (.)", lambda m: m.group(1).upper(), intro)
        found.append((title, table, intro))
    return found


def config_page() -> str:
    from nodekit.config.settings import Settings

    out = [
        "# nodekit.toml",
        "",
        HEADER,
        "",
        "One file describes the image and the job; every node uses the same file. Precedence, highest first: "
        "command-line flags, `NODEKIT_*` environment variables, `nodekit.toml`, the defaults below. A list or a "
        "table given as a variable is JSON (`NODEKIT_PACKAGES='[\"torch==2.13.0\"]'`). `nodekit init` writes a "
        "commented starter; an unknown key is refused with the known key closest to it.",
        "",
        "## Top-level keys",
        "",
        *_table(Settings, "NODEKIT_"),
    ]
    for title, model, intro in tables(Settings):
        out += ["", f"## {title}", "", intro, "", *_table(model, None)]
    return "\n".join(out) + "\n"


# ---- exit codes ----------------------------------------------------------------------------------------------


def exit_codes(source: str) -> list[tuple[str, int, str]]:
    """``(name, value, meaning)`` of every ``EXIT_* = N  # meaning`` line of ``source`` (contract.py's text)."""
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.startswith("EXIT_") and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                found.append((name, node.value.value, comments.get(node.lineno, "")))
    return found


def _errors() -> Iterator[tuple[str, int, str]]:
    from nodekit import errors

    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.NodekitError) and cls is not errors.NodekitError:
            doc = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
            code = "the job's" if cls is errors.JobFailed else str(cls.exit_code)
            yield name, code, doc  # type: ignore[misc]


def exit_codes_page() -> str:
    from nodekit.launcher import contract

    codes = exit_codes(Path(contract.__file__).read_text(encoding="utf-8"))
    out = [
        "# Exit codes",
        "",
        HEADER,
        "",
        "## A node's job",
        "",
        "What a node's container exits with (and so `nodekit up`, and `nodekit run` with the failing node's), from "
        "`nodekit/launcher/contract.py`. Any other code is the job's own (torchrun's, in torchrun mode).",
        "",
        "| code | name | meaning |",
        "| --- | --- | --- |",
        *(f"| {value} | `{name}` | {_cell(meaning)} |" for name, value, meaning in codes),
        "",
        "## nodekit's own refusals",
        "",
        "What a `nodekit` command exits with when it refuses or fails before (or instead of) a job, from the error "
        "tree in `nodekit/errors.py`; every one is a single line with the fix. A signal (SIGINT, SIGTERM, SIGHUP) "
        "stops what the command started and exits 128 + the signal.",
        "",
        "| code | error | when |",
        "| --- | --- | --- |",
        *(f"| {code} | `{name}` | {_cell(doc)} |" for name, code, doc in _errors()),
    ]
    return "\n".join(out) + "\n"


def pages() -> dict[str, str]:
    """Every reference page's name and text, as the code says now."""
    return {"cli.md": cli_page(), "config.md": config_page(), "exit-codes.md": exit_codes_page()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "docs/reference")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
