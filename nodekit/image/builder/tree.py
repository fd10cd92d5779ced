"""Trees: walk a directory with Docker's .dockerignore semantics, hash it, and optionally stage a copy.

The staged trees are hashed while they are copied, so the fingerprint describes exactly what BuildKit receives.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path
from typing import Literal

from nodekit.config.settings import Settings
from nodekit.errors import ConfigError
from nodekit.image.plan import SOURCE_DATE_EPOCH, IgnoreRules, TreeEntry, ignore_rules, normal_mode
from nodekit.system.assets import launcher_dir


def _kind(st_mode: int) -> Literal["file", "link", "dir"] | None:
    if stat.S_ISLNK(st_mode):
        return "link"
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISREG(st_mode):
        return "file"
    return None  # sockets, fifos, devices: Docker cannot ship them either


def _walk(root: Path, rules: IgnoreRules) -> list[tuple[str, Path, os.stat_result]]:
    """Included paths under ``root`` (relative, '/'-separated, sorted), with Docker's .dockerignore semantics."""
    found: list[tuple[str, Path, os.stat_result]] = []
    parents: set[str] = set()

    def visit(directory: Path, rel: str) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as e:
            raise ConfigError(
                f"cannot read {directory}: {e.strerror}", fix="fix its permissions, or .dockerignore it"
            ) from None
        for name in names:
            path = directory / name
            r = f"{rel}/{name}" if rel else name
            st = path.lstat()
            kind = _kind(st.st_mode)
            if kind is None:
                continue
            excluded = rules.excluded(r)
            if kind == "dir":
                if not excluded:
                    found.append((r, path, st))
                if not excluded or rules.may_include_below(r):
                    visit(path, r)
            elif not excluded:
                found.append((r, path, st))
                if "/" in r:
                    parents.add(r.rsplit("/", 1)[0])

    visit(root, "")
    # A file re-included by a `!` pattern inside an excluded directory still needs its parent directories.
    have = {r for r, _, _ in found}
    for p in sorted(parents):
        parts = p.split("/")
        for i in range(1, len(parts) + 1):
            anc = "/".join(parts[:i])
            if anc not in have:
                have.add(anc)
                apath = root / anc
                found.append((anc, apath, apath.lstat()))
    found.sort(key=lambda t: t[0])
    return found


def _hash_copy(src: Path, dest: Path | None) -> str:
    """sha256 of ``src``; with ``dest``, the bytes hashed are the bytes written (no race with an editor)."""
    h = hashlib.sha256()
    with src.open("rb") as f, dest.open("wb") if dest else contextlib.nullcontext() as out:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            if out is not None:
                out.write(chunk)
    return h.hexdigest()


def hash_tree(root: Path, rules: IgnoreRules, *, prefix: str = "", stage: Path | None = None) -> tuple[TreeEntry, ...]:
    """The tree under ``root`` as fingerprint entries, paths prefixed with ``prefix``.

    With ``stage``, the tree is also copied there, modes normalized and every mtime (``stage`` itself included)
    clamped to SOURCE_DATE_EPOCH, so the layer made from it is the same on every machine; the entries describe
    the copy.
    """
    entries = []
    dirs = [stage] if stage else []
    if stage:
        stage.mkdir(parents=True, exist_ok=True)
        stage.chmod(0o755)
    for rel, path, st in _walk(root, rules):
        kind = _kind(st.st_mode)
        assert kind is not None
        mode = normal_mode(kind, st.st_mode)
        target = stage / rel if stage else None
        if kind == "dir":
            digest, size = "", 0
            if target:
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(mode)
                dirs.append(target)
        elif kind == "link":
            link = os.readlink(path)
            digest, size = hashlib.sha256(link.encode()).hexdigest(), 0
            if target:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(link, target)
                os.utime(target, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
        else:
            if target:
                target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = _hash_copy(path, target), st.st_size
            if target:
                target.chmod(mode)
                os.utime(target, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
        entries.append(TreeEntry(path=f"{prefix}{rel}", kind=kind, mode=mode, digest=digest, size=size))
    _clamp_dirs(dirs)
    return tuple(entries)


def _clamp_dirs(dirs: list[Path]) -> None:
    # Deepest first: creating an entry touches its parent's mtime.
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        os.utime(d, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def _relative(settings: Settings, path: Path) -> str | None:
    try:
        return settings.resolve(path).resolve().relative_to(settings.project_dir.resolve()).as_posix()
    except ValueError:
        return None


def code_rules(settings: Settings) -> IgnoreRules:
    """nodekit's default exclusions, generated compose files and outputs, then the project's .dockerignore.

    What nodekit itself writes into the project never counts as code: a compose directory of its own is excluded
    whole, since even empty it would be a directory in the image and so change the fingerprint (``nodekit up`` on
    one node would make the image look stale to the next).
    """
    extra = []
    if (compose := _relative(settings, settings.compose_dir)) is not None:
        extra.append(compose if compose != "." else "node-*.yaml")
    if (outputs := _relative(settings, settings.output_dir)) not in (None, "."):
        extra.append(str(outputs))
    # What `nodekit data gather` brings back (its default --into) is the job's output, never code.
    extra.append("gathered")
    # A dataset kept in the project is sent to the hosts by `nodekit data push`, never built into the image.
    for m in settings.mounts:
        if m.source and (src := _relative(settings, Path(m.source))) is not None and src != ".":
            extra.append(src)
    dockerignore = settings.project_dir / ".dockerignore"
    return ignore_rules(dockerignore.read_text() if dockerignore.is_file() else None, extra_excludes=extra)


_LAUNCHER_RULES = IgnoreRules(["**/__pycache__", "**/*.pyc", "**/*.pyo"])


def launcher_tree(stage: Path | None = None) -> tuple[TreeEntry, ...]:
    """nodekit/__init__.py and nodekit/launcher/, as shipped to /opt/nodekit/nodekit in the image."""
    init = launcher_dir().parent / "__init__.py"
    mode = normal_mode("file", init.stat().st_mode)
    sub = stage / "nodekit" / "launcher" if stage else None
    if stage and sub:
        sub.mkdir(parents=True, exist_ok=True)
    digest = _hash_copy(init, stage / "nodekit" / "__init__.py" if stage else None)
    head = (
        TreeEntry(path="nodekit", kind="dir", mode=0o755),
        TreeEntry(path="nodekit/__init__.py", kind="file", mode=mode, digest=digest, size=init.stat().st_size),
        TreeEntry(path="nodekit/launcher", kind="dir", mode=0o755),
    )
    tail = hash_tree(launcher_dir(), _LAUNCHER_RULES, prefix="nodekit/launcher/", stage=sub)
    if stage:
        (stage / "nodekit" / "__init__.py").chmod(mode)
        os.utime(stage / "nodekit" / "__init__.py", (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
        _clamp_dirs([stage, stage / "nodekit"])
    return head + tail
