"""Pure: the image build plan, its stack fingerprint, tag and labels, and Docker's ``.dockerignore`` rules.

Nothing here touches Docker, the file system or the process environment. Callers gather the facts (the base
image id, the lock text, the Dockerfile text, file trees as :class:`TreeEntry` tuples) and pass them in, so the
same inputs give the same fingerprint on any machine, and tests compare plans to expected values.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from nodekit.errors import ConfigError

# Bump when the encoding below changes: old and new fingerprints must never collide.
FINGERPRINT_SCHEME = "nodekit-stack-v1"
TAG_LENGTH = 12

LABEL_NAME = "org.nodekit.name"
LABEL_FINGERPRINT = "org.nodekit.fingerprint"
LABEL_LOCK = "org.nodekit.lock-sha256"
LABEL_TORCH = "org.nodekit.torch"
LABEL_PYTHON = "org.nodekit.python"
LABEL_BASE = "org.nodekit.base"
LABEL_BASE_ID = "org.nodekit.base-id"
LABEL_VERSION = "org.nodekit.version"

# Staging layout under <project>/.nodekit/build/: what is hashed is exactly what is sent to BuildKit. The code,
# launcher and Dockerfile go to a directory named by the fingerprint: their mtimes are clamped to
# SOURCE_DATE_EPOCH (reproducible layers), and BuildKit's incremental context transfer compares mtimes and sizes,
# so a reused path could keep a stale copy of a same-size edit. The wheels keep one path: their names and hashes
# change together.
STAGE_LAUNCHER = "launcher"  # the main build context: nodekit/__init__.py + nodekit/launcher/
STAGE_CODE = "code"  # --build-context code=...: the project after .dockerignore
STAGE_WHEELS = "wheels"  # --build-context wheels=...: the locked wheels + nodekit.lock, bind-mounted
STAGE_FRAMEWORK = "framework"  # --build-context framework=...: the framework's wheels + framework.lock
FRAMEWORK_LOCK = "framework.lock"  # in STAGE_FRAMEWORK: the lock's framework lines (its own layer)
PACKAGES_LOCK = "packages.lock"  # in STAGE_WHEELS: the other lines (the packages layer above it)
STAGE_DOCKERFILE = "Dockerfile"

# The packages of the framework layer: torch and what ships with it, most of the image's bytes (6-10 GB with
# CUDA) and the packages that change least. Everything else the lock pins goes to the packages layer above it, so
# adding or upgrading a package rebuilds and ships that layer alone. setuptools goes with the framework because
# ensurepip puts its own copy into the environment in that step: replacing it there keeps the old copy out of the
# image (a later layer would only hide it under a whiteout).
FRAMEWORK_PACKAGE = re.compile(
    r"^(torch|torchvision|torchaudio|triton|pytorch-triton(-[a-z0-9]+)*|nvidia-[a-z0-9-]+|setuptools)=="
)

# Every timestamp the image carries (config, history, file mtimes) is this instant, 2025-01-01T00:00:00Z, so two
# builds of the same inputs give the same image id. `docker images` therefore shows the same "created" for all.
SOURCE_DATE_EPOCH = 1735689600

# Always left out of the user's code tree, before the user's own .dockerignore (whose `!` lines can override).
# .nodekit holds the staging area and the wheelhouse; .dockerignore is filtering input, not code; the lock is
# deliberately NOT excluded: the image carries the lock it was built from.
DEFAULT_EXCLUDES: tuple[str, ...] = (".git", ".nodekit", ".dockerignore", "**/__pycache__", "**/*.pyc")

# Arguments the Dockerfile declares after the last filesystem step: metadata only, so they never invalidate a
# layer, and they are not fingerprint inputs (they are derived from the inputs, the fingerprint among them).
METADATA_ARGS = (
    "NODEKIT_NAME",
    "NODEKIT_FINGERPRINT",
    "NODEKIT_LOCK_SHA256",
    "NODEKIT_TORCH",
    "NODEKIT_PYTHON",
    "NODEKIT_BASE",
    "NODEKIT_BASE_ID",
    "NODEKIT_VERSION",
)

_FROZEN = ConfigDict(frozen=True, extra="forbid")


# --- .dockerignore ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    text: str
    exclusion: bool  # True for `!pattern`: re-includes what earlier patterns excluded
    regex: re.Pattern[str]
    prefix: str  # the literal part before the first wildcard, for deciding whether to walk into a directory


def _compile(pattern: str) -> re.Pattern[str]:
    """moby/patternmatcher's translation: `**` spans directories (also none), `*` and `?` stay in one."""
    out = ["^"]
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        ch = pattern[i]
        if in_class and ch not in "]\\":
            out.append(ch)  # inside [...] ranges and negation pass through, as in Go's regexp
        elif ch == "*":
            if i + 1 < n and pattern[i + 1] == "*":
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                out.append(".*" if i >= n else "(.*/)?")
                continue
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\":
            if i + 1 < n:
                i += 1
                out.append(re.escape(pattern[i]))
            else:
                out.append(r"\\")
        elif ch in "[]":
            in_class = ch == "["
            out.append(ch)
        else:
            out.append(re.escape(ch))
        i += 1
    out.append("$")
    return re.compile("".join(out), re.DOTALL)


def _literal_prefix(pattern: str) -> str:
    m = re.search(r"[*?\[\\]", pattern)
    return pattern if m is None else pattern[: m.start()]


def parse_dockerignore(text: str) -> list[str]:
    """The patterns of a ``.dockerignore`` file, normalized the way Docker does.

    A line whose first character is ``#`` is a comment; surrounding whitespace is trimmed; a leading ``!``
    marks an exception; each pattern is cleaned like Go's ``filepath.Clean`` and a leading ``/`` dropped
    (patterns are always relative to the context root, unlike ``.gitignore``).
    """
    patterns: list[str] = []
    for number, raw in enumerate(text.splitlines()):
        line = raw.removeprefix("\ufeff") if number == 0 else raw
        if line.startswith("#"):
            continue
        line = line.strip()
        if not line:
            continue
        invert = line.startswith("!")
        if invert:
            line = line[1:].strip()
        if line:
            line = posixpath.normpath(line)
            if len(line) > 1 and line.startswith("/"):
                line = line.lstrip("/") or "/"
        patterns.append(("!" if invert else "") + line)
    return patterns


class IgnoreRules:
    """Docker's matching: a path is excluded when the last pattern matching it or one of its parents excludes.

    Patterns apply in order; ``!`` patterns re-include. Matching a directory excludes all below it unless a
    later exception matches something inside.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        compiled: list[_Pattern] = []
        for p in patterns:
            exclusion = p.startswith("!")
            body = p[1:] if exclusion else p
            if not body or body == ".":
                continue
            try:
                regex = _compile(body)
            except re.error as e:
                raise ConfigError(
                    f".dockerignore pattern {p!r} is invalid ({e})", fix="fix it in .dockerignore"
                ) from None
            compiled.append(_Pattern(p, exclusion, regex, _literal_prefix(body)))
        self._patterns = tuple(compiled)
        self._exceptions = tuple(p for p in compiled if p.exclusion)

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(p.text for p in self._patterns)

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (relative, ``/``-separated) is left out of the context."""
        parts = path.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        matched = False
        for pattern in self._patterns:
            # As in patternmatcher: an exclusion only matters once something matched, and vice versa.
            if pattern.exclusion != matched:
                continue
            if any(pattern.regex.match(c) for c in candidates):
                matched = not pattern.exclusion
        return matched

    def may_include_below(self, directory: str) -> bool:
        """Whether some exception could re-include a path under the excluded ``directory`` (walk into it)."""
        below = directory + "/"
        for p in self._exceptions:
            prefix = p.prefix
            if prefix.startswith(below) or below.startswith(prefix) or p.text[1:].startswith("**"):
                return True
        return False


def ignore_rules(dockerignore: str | None, *, extra_excludes: Sequence[str] = ()) -> IgnoreRules:
    """nodekit's defaults, then ``extra_excludes`` (generated compose files, outputs), then the user's file."""
    user = parse_dockerignore(dockerignore) if dockerignore is not None else []
    return IgnoreRules([*DEFAULT_EXCLUDES, *extra_excludes, *user])


# --- file trees and the fingerprint -------------------------------------------------------------------------


class TreeEntry(BaseModel):
    """One path of a tree shipped into the image.

    ``mode`` is normalized (0644/0755 files, 0755 directories, 0777 links) so a different umask on another
    machine gives the same fingerprint and the same image; ``digest`` is the sha256 of a file's content or of a
    link's target. ``size`` is informational and not part of the fingerprint (the digest covers it).
    """

    model_config = _FROZEN

    path: str
    kind: Literal["file", "link", "dir"]
    mode: int
    digest: str = ""
    size: int = 0


def normal_mode(kind: Literal["file", "link", "dir"], st_mode: int) -> int:
    """The mode shipped for a path: only the executable bit of a file survives, as in git."""
    if kind == "dir":
        return 0o755
    if kind == "link":
        return 0o777
    return 0o755 if st_mode & 0o111 else 0o644


class StackInputs(BaseModel):
    """Everything that defines the stack. Equal inputs give equal fingerprints; nothing else enters."""

    model_config = _FROZEN

    base_id: str
    lock_text: str
    dockerfile_text: str
    build_args: tuple[tuple[str, str], ...]
    launcher: tuple[TreeEntry, ...]
    code: tuple[TreeEntry, ...]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tree(entries: Iterable[TreeEntry]) -> list[list[object]]:
    return [[e.path, e.kind, f"{e.mode:o}", e.digest] for e in sorted(entries, key=lambda e: e.path)]


def fingerprint(inputs: StackInputs) -> str:
    """The full stack fingerprint: sha256 (hex) of a canonical JSON encoding of ``inputs``.

    Trees are sorted by path and build arguments by name, so neither walk order nor argument order matters;
    mtimes, owners and sizes are not inputs.
    """
    doc = {
        "scheme": FINGERPRINT_SCHEME,
        "base_id": inputs.base_id,
        "lock": _sha256(inputs.lock_text),
        # Which pins the framework layer holds (split_lock's rule is code, not an input file): a change of the rule
        # changes the layers, so it changes the fingerprint.
        "framework": _sha256(split_lock(inputs.lock_text)[0]),
        "dockerfile": _sha256(inputs.dockerfile_text),
        "build_args": sorted([k, v] for k, v in inputs.build_args),
        "launcher": _tree(inputs.launcher),
        "code": _tree(inputs.code),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def image_tag(name: str, fp: str) -> str:
    """``nodekit/<name>:<first 12 hex digits of the fingerprint>``."""
    return f"nodekit/{name}:{fp[:TAG_LENGTH]}"


# --- the build plan -----------------------------------------------------------------------------------------


class BuildPlan(BaseModel):
    """What ``nodekit build`` will do, complete enough to print for ``--dry-run`` and to run as is."""

    model_config = _FROZEN

    name: str
    tag: str
    fingerprint: str
    base_image: str
    base_id: str
    lock_sha256: str
    python: str
    torch: str
    packages: int
    dockerfile: Path
    context: Path
    build_contexts: tuple[tuple[str, Path], ...]
    build_args: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    code_files: int
    code_bytes: int
    launcher_files: int
    no_cache: bool = False

    def describe(self) -> str:
        """The plan as text, for ``nodekit build --dry-run``."""
        rows = [
            ("image", self.tag),
            ("fingerprint", self.fingerprint),
            ("base", f"{self.base_image} ({self.base_id})"),
            ("python", self.python),
            ("torch", self.torch),
            ("lock", f"{self.packages} packages, sha256 {self.lock_sha256}"),
            ("code", f"{self.code_files} files, {self.code_bytes} bytes"),
            ("launcher", f"{self.launcher_files} files"),
            ("dockerfile", str(self.dockerfile)),
            ("context", str(self.context)),
            *((f"context {k}", str(v)) for k, v in self.build_contexts),
            # The metadata arguments only carry the labels below into the Dockerfile; listing them twice is noise.
            *((f"build-arg {k}", v) for k, v in self.build_args if k not in METADATA_ARGS),
            *((f"label {k}", v) for k, v in self.labels),
        ]
        if self.no_cache:
            rows.append(("cache", "disabled (--no-cache)"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def split_lock(lock_text: str) -> tuple[str, str]:
    """Pure: ``(framework, packages)``, the lock's requirement lines split between the framework layer and the
    packages layer (see FRAMEWORK_PACKAGE); each keeps the lock's comment header, so either is a valid
    ``--require-hashes`` requirement file on its own."""
    header = [ln for ln in lock_text.splitlines() if not ln or ln.startswith("#")]
    lines = [ln for ln in lock_text.splitlines() if ln and not ln.startswith("#")]
    framework = [ln for ln in lines if FRAMEWORK_PACKAGE.match(ln)]
    packages = [ln for ln in lines if not FRAMEWORK_PACKAGE.match(ln)]
    head = "\n".join(header).rstrip("\n") + "\n"
    return head + "".join(f"{ln}\n" for ln in framework), head + "".join(f"{ln}\n" for ln in packages)


def input_build_args(base_image: str, base_python: str = "python3", base_site: Sequence[str] = ()) -> dict[str, str]:
    """The Dockerfile arguments that shape the filesystem; they are fingerprint inputs.

    ``base_python`` is the base's interpreter the job's environment is made from (the probe's answer) and
    ``base_site`` its site directories, which that environment keeps seeing (what the base provides stays).
    """
    return {
        "BASE_IMAGE": base_image,
        "BASE_PYTHON": base_python,
        "BASE_SITE": json.dumps(list(base_site)),
        "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
    }


def image_labels(
    *, name: str, fp: str, lock_sha256: str, torch: str, python: str, base_image: str, base_id: str, version: str
) -> dict[str, str]:
    """The labels every nodekit image carries (the Dockerfile sets them from the metadata arguments)."""
    return {
        LABEL_NAME: name,
        LABEL_FINGERPRINT: fp,
        LABEL_LOCK: lock_sha256,
        LABEL_TORCH: torch,
        LABEL_PYTHON: python,
        LABEL_BASE: base_image,
        LABEL_BASE_ID: base_id,
        LABEL_VERSION: version,
    }


def _metadata_args(labels: Mapping[str, str]) -> dict[str, str]:
    return {
        "NODEKIT_NAME": labels[LABEL_NAME],
        "NODEKIT_FINGERPRINT": labels[LABEL_FINGERPRINT],
        "NODEKIT_LOCK_SHA256": labels[LABEL_LOCK],
        "NODEKIT_TORCH": labels[LABEL_TORCH],
        "NODEKIT_PYTHON": labels[LABEL_PYTHON],
        "NODEKIT_BASE": labels[LABEL_BASE],
        "NODEKIT_BASE_ID": labels[LABEL_BASE_ID],
        "NODEKIT_VERSION": labels[LABEL_VERSION],
    }


def plan_build(
    *,
    name: str,
    base_image: str,
    base_id: str,
    lock_text: str,
    torch: str,
    packages: int,
    python: str,
    dockerfile_text: str,
    launcher: Sequence[TreeEntry],
    code: Sequence[TreeEntry],
    stage_dir: Path,
    version: str,
    no_cache: bool = False,
    base_python: str = "python3",
    base_site: Sequence[str] = (),
) -> BuildPlan:
    """The build of ``name`` from these inputs, its contexts staged under ``stage_dir`` (see STAGE_*)."""
    args = input_build_args(base_image, base_python, base_site)
    inputs = StackInputs(
        base_id=base_id,
        lock_text=lock_text,
        dockerfile_text=dockerfile_text,
        build_args=tuple(sorted(args.items())),
        launcher=tuple(launcher),
        code=tuple(code),
    )
    fp = fingerprint(inputs)
    lock_sha = _sha256(lock_text)
    labels = image_labels(
        name=name,
        fp=fp,
        lock_sha256=lock_sha,
        torch=torch,
        python=python,
        base_image=base_image,
        base_id=base_id,
        version=version,
    )
    return BuildPlan(
        name=name,
        tag=image_tag(name, fp),
        fingerprint=fp,
        base_image=base_image,
        base_id=base_id,
        lock_sha256=lock_sha,
        python=python,
        torch=torch,
        packages=packages,
        dockerfile=stage_dir / fp[:TAG_LENGTH] / STAGE_DOCKERFILE,
        context=stage_dir / fp[:TAG_LENGTH] / STAGE_LAUNCHER,
        build_contexts=(
            (STAGE_CODE, stage_dir / fp[:TAG_LENGTH] / STAGE_CODE),
            (STAGE_WHEELS, stage_dir / STAGE_WHEELS),
            (STAGE_FRAMEWORK, stage_dir / STAGE_FRAMEWORK),
        ),
        build_args=tuple(sorted({**args, **_metadata_args(labels)}.items())),
        labels=tuple(sorted(labels.items())),
        code_files=sum(1 for e in code if e.kind == "file"),
        code_bytes=sum(e.size for e in code),
        launcher_files=sum(1 for e in launcher if e.kind == "file"),
        no_cache=no_cache,
    )
