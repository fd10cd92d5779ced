"""The file side of the configuration: where nodekit.toml is, reading it, turning a refusal into one line, and the
project paths nodekit will write to. ``settings.py`` holds the model and :func:`nodekit.config.settings.load`."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from nodekit.config import backends, keys
from nodekit.errors import ConfigError
from nodekit.system.files import NotReadable, read_bounded

CONFIG_FILE = "nodekit.toml"
STATE_DIR = ".nodekit"
# The file being loaded, for the TOML source that pydantic-settings builds inside Settings().
current: ContextVar[Path | None] = ContextVar("nodekit_config_file", default=None)


def config_path(explicit: Path | None, environ: Mapping[str, str]) -> Path:
    """Where the configuration file is: the flag, else NODEKIT_CONFIG, else ./nodekit.toml."""
    if explicit is not None:
        return explicit
    if environ.get("NODEKIT_CONFIG"):
        return Path(environ["NODEKIT_CONFIG"])
    return Path(CONFIG_FILE)


def read_text(path: Path, what: str, fix: str) -> str:
    """The UTF-8 text of the small regular file ``path`` (``what`` names it in messages: "hostfile /p/hosts"), or
    one ConfigError: it cannot be read (``fix`` goes with that), is not a regular file (a directory, a FIFO, a
    device: never read, so nothing hangs), is larger than :data:`~nodekit.system.files.READ_CAP`, or is not UTF-8
    (the byte and its line named)."""
    try:
        raw = read_bounded(path)
    except NotReadable as e:
        raise ConfigError(f"{what} {e}", fix=fix) from None
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", fix=fix) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{what} is not UTF-8 (byte {raw[e.start]:#04x} on line {line})",
            fix=f"save {path.name} as UTF-8",
        ) from None


def read_toml(path: Path) -> dict[str, Any]:
    """The file's tables; a ConfigError naming the file when it cannot be read, is not a regular file, not UTF-8,
    not TOML, or nests deeper than the parser can go."""
    text = read_text(path, str(path), f"make {path} a regular UTF-8 file you can read (nodekit init writes one)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}", fix=f"edit {path}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(
            f"{path} nests arrays or tables deeper than nodekit reads (hundreds of levels)", fix=f"edit {path}"
        ) from None


class TomlSource(PydanticBaseSettingsSource):
    """nodekit.toml, read once; an absent file contributes nothing."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        if path is not None and (path.exists() or path.is_symlink()):
            self._data = read_toml(path)  # a directory, FIFO or dangling link there is refused, never skipped

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def shown_key(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """A setting's location as the user writes it: ``nnodes``, ``[nodes.1] addr``, ``[[mounts]] #2 container``,
    ``[slurm] time``, ``env.KEY``; pydantic's union-branch tags (``literal['auto']``) left out."""
    parts = [str(p) for p in loc if "[" not in str(p)]
    if len(parts) >= 3 and parts[0] == "nodes":
        return f"[nodes.{parts[1]}] {'.'.join(parts[2:])}"
    if len(parts) >= 2 and parts[0] in backends.tables():
        return f"[{parts[0]}] {'.'.join(parts[1:])}"
    if len(parts) >= 2 and parts[0] == "mounts" and parts[1].isdigit():
        return " ".join([f"[[mounts]] #{int(parts[1]) + 1}", *parts[2:3]])
    return ".".join(parts) or "config"


_LISTED = 12  # a table with more keys than this is not listed in the fix of an unknown key


def refusal(e: ValidationError, path: Path, model: type[BaseModel], source: Callable[[str], str]) -> ConfigError:
    """The first problem of a failed validation as one ConfigError: where it is (``nodekit.toml:7``, or the
    ``NODEKIT_*`` variable or the flag that set it), the setting, what is wrong, the fix. Checks that raise
    ``nodekit.config.tables.Bad`` bring their own fix and, for checks across fields, their key. An unknown key is
    answered with the known key closest to it (``nproc_per_nodes``: did you mean ``nproc_per_node``?).
    ``source(top)`` says where the top-level setting ``top`` came from: "flag", "env" or "file"."""
    err = e.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    key = getattr(cause, "key", None)
    loc: list[int | str] = key.split(".") if key else list(err["loc"])
    where = shown_key(loc)
    message = str(cause) if isinstance(cause, ValueError) else err["msg"]
    top = where.split(".")[0]
    origin = source(str(loc[0])) if loc else "file"
    fix = getattr(cause, "fix", None) or (
        f"set {top} in {path.name}, NODEKIT_{top.upper()} or the flag"
        if top.isidentifier()
        else f"edit {where} in {path.name}"
    )
    if err["type"] == "extra_forbidden":
        word = str(loc[-1])
        known = keys.known_keys(model, loc[:-1])
        guess = keys.did_you_mean(word, known)
        listed = (
            f"known here: {', '.join(known)}"
            if len(known) <= _LISTED
            else "the nodekit.toml reference lists every setting"
        )
        fix = (
            f"did you mean {guess}? rename {word} to {guess} in {path.name}"
            if guess is not None
            else f"remove {word} from {path.name} ({listed})"
        )
    shown = shown_path(path)
    flag = "the arguments after --" if loc and loc[0] == "args" else f"--{str(loc[0]).replace('_', '-')}"
    at = {"flag": f"{flag}: ", "env": f"NODEKIT_{str(loc[0]).upper()}: "}.get(origin, "")
    if origin == "file":
        line = _line_in(path, loc)
        at = f"{shown}:{line}: " if line is not None else f"{shown}: "
    if err["type"] == "extra_forbidden":
        return ConfigError(f"{at}unknown setting {where}", fix=fix)
    return ConfigError(f"{at}invalid setting {where}: {message}", fix=fix)


def shown_path(path: Path) -> str:
    """``path`` as the user would type it: relative to the working directory when it is under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def output_dir_key(origin: str, config: Path) -> str:
    """How a refusal of ``output_dir`` names where it was set: ``nodekit.toml:7: output_dir``, the variable, or
    the flag."""
    line = _line_in(config, ("output_dir",)) if origin == "file" else None
    if line is not None:
        return f"{shown_path(config)}:{line}: output_dir"
    # The settings' variable, named as pydantic-settings derives it (the launcher's variable of that name is another).
    return {"env": f"NODEKIT_{'output_dir'.upper()}", "flag": "--output-dir"}.get(origin, "output_dir")


def _line_in(path: Path, loc: Sequence[int | str]) -> int | None:
    try:
        return keys.line_of(path.read_text(encoding="utf-8"), loc)
    except (OSError, UnicodeDecodeError):
        return None


def state_link(state: Path) -> Path | None:
    """The first symbolic link among ``state`` (``.nodekit``), what it holds, what its ``wheelhouse/`` and
    ``build/`` hold, and what the directories the build keeps there hold (its wheel directories, which staging
    empties of other files); None when there is none. The build's contexts (12 hex digits, copies of the project's
    code with its own links) and the run records' directories are not looked into: the former are removed, never
    written through, and the latter are only read (a report written into one refuses a link itself)."""
    if state.is_symlink():
        return state
    below = [state, state / "wheelhouse", state / "build"]
    for d in below:
        try:
            with os.scandir(d) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        return Path(entry.path)
                    kept = d == state / "build" and not re.fullmatch(r"[0-9a-f]{12}|\.staging", entry.name)
                    if kept and entry.is_dir(follow_symlinks=False):
                        below.append(Path(entry.path))
        except OSError:  # not there (yet); what cannot be read is named by the checks that follow, or on writing
            continue
    return None


def check_paths(project: Path, compose_dir: Path, output_dir: Path, *, output_key: str = "output_dir") -> None:
    """A ConfigError when something other than a directory stands where nodekit keeps a directory: ``.nodekit``,
    ``compose_dir``, ``output_dir`` or one of their parents. Read-only: whether a directory is writable shows when
    nodekit writes (an OSError the CLI reports in one line), since commands that only read must still work. Also
    refused: an ``output_dir`` that the job, which gets it read-write at /outputs, must not have: the project
    directory or one above it (``""``, ``.``, ``..``, ``/``: the project's code, its job secret and more), or one
    that is, is inside or holds ``.nodekit`` (the job secret, the run records) or ``compose_dir`` (the compose
    files a user runs by hand). ``output_key`` names where ``output_dir`` was set (:func:`output_dir_key`)."""
    try:
        out = output_dir.resolve()
        above = project.resolve().is_relative_to(out)
        kept = [
            (name, d)
            for name, d in ((STATE_DIR, (project / STATE_DIR).resolve()), ("compose_dir", compose_dir.resolve()))
            if out.is_relative_to(d) or d.is_relative_to(out)
        ]
    except OSError:
        above, kept = False, []
    if above:
        raise ConfigError(
            f"{output_key} {output_dir} is the project directory or one above it: the job would get it read-write "
            "at /outputs",
            fix='output_dir = "outputs" (a directory of its own)',
        )
    if kept:
        name, d = kept[0]
        what = (
            f"{STATE_DIR}, nodekit's own state (the job secret, the run records)"
            if name == STATE_DIR
            else f"compose_dir {d}, the compose files"
        )
        relation = "is" if out == d else ("is inside" if out.is_relative_to(d) else "holds")
        raise ConfigError(
            f"{output_key} {output_dir} {relation} {what}: the job would get it read-write at /outputs",
            fix='output_dir = "outputs" (a directory of its own, apart from .nodekit and compose_dir)',
        )
    link = state_link(project / STATE_DIR)
    if link is not None:
        raise ConfigError(
            f"{link} is a symbolic link in {STATE_DIR}, nodekit's own state (the job secret, run records, the build's "
            "staging), which a cloned repository can plant to have nodekit write or delete where it points",
            fix=f"remove the link (rm {link}); nodekit makes its own directory there",
        )
    for key, path in ((STATE_DIR, project / STATE_DIR), ("compose_dir", compose_dir), ("output_dir", output_dir)):
        here = path
        try:
            while not here.is_dir():
                if here.exists() or here.is_symlink():
                    what = "a dangling link" if not here.exists() else "a file"
                    raise ConfigError(
                        f"{key} {path} cannot be a directory: {here} is {what}",
                        fix=f"move {here} away" if key == STATE_DIR else f"set {key} to a directory, or move {here}",
                    )
                if here == here.parent:
                    break
                here = here.parent
        except OSError as e:
            raise ConfigError(f"cannot look at {key} {path}: {e.strerror}", fix=f"check {here}") from None
