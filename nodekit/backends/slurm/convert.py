"""The image as a file on the shared path, made from this machine's Docker engine (no registry).

- charliecloud: the image's files (``docker export`` of a container created from it, never started), laid out as
  Charliecloud's ``ch-convert`` lays them out (the image's ENV in /ch/environment, the mount points ch-run needs),
  plus the container's own mount points (ch-run binds onto existing directories only, and a SquashFS is read-only),
  then ``mksquashfs`` with lz4. ``ch-convert`` itself is not used: it is in charliecloud-builders, which depends on
  Debian's docker.io, and its docker path compresses the image twice (docs/scale.md has the measurements);
- pyxis: ``enroot import -o FILE dockerd://REF`` (enroot's own SquashFS; not installable here, so never run in CI).

The file is written under a temporary name next to its place and renamed when complete: an interrupted conversion
never leaves a file that looks done. Its name carries the image id (``submit.image_file``), which makes the shared
directory a cache: the next job of the same image finds it.

These are new Docker operations (create, export, rm) kept in this package until nodekit's Docker module takes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from nodekit.backends.slurm import cmd
from nodekit.errors import NodekitError
from nodekit.system.files import write_atomic

CONVERT_S = 3600.0  # a CUDA image (10 GB and more) on a small machine
# The mount points Charliecloud's own conversion makes (ch-convert's mount_points_ensure).
CH_DIRS = ("bin", "dev", "etc", "mnt", "proc", "usr", *(f"mnt/{i}" for i in range(10)))
CH_FILES = ("etc/hosts", "etc/resolv.conf")
# lz4: several times faster to make than mksquashfs's default gzip, for a somewhat larger file (docs/scale.md).
MKSQUASHFS = ("-b", "65536", "-noappend", "-all-root", "-comp", "lz4", "-quiet", "-no-progress")
# Streams the container's files into the tree; pipefail so that a failed export is not a half-empty image.
EXPORT = 'set -o pipefail; docker export "$1" | tar -x --no-same-owner -C "$2"'


def convert(ref: str, dest: Path, mode: str, mount_points: Sequence[str], env: Sequence[tuple[str, str]]) -> float:
    """Make ``dest`` from ``ref``; the seconds it took. Raises NodekitError with the tool's own message."""
    started = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        if mode == "pyxis":
            _check(cmd.run(["enroot", "import", "-o", str(partial), f"dockerd://{ref}"], timeout=CONVERT_S), ref)
        else:
            _charliecloud(ref, partial, mount_points, env)
        partial.replace(dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return time.monotonic() - started


def _charliecloud(ref: str, out: Path, mount_points: Sequence[str], env: Sequence[tuple[str, str]]) -> None:
    # The unpacked tree next to the output (the same file system, which is sized for images), removed afterwards.
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tree = work / "img"
    tree.mkdir()
    created = cmd.run(["docker", "create", ref, "/bin/true"])
    _check(created, ref)
    cid = created.out.strip()
    try:
        _check(cmd.run(["bash", "-c", EXPORT, "nodekit-export", cid, str(tree)], timeout=CONVERT_S), ref)
        lay_out(tree, mount_points, env)
        _check(cmd.run(["mksquashfs", str(tree), str(out), *MKSQUASHFS], timeout=CONVERT_S), ref)
    finally:
        cmd.run(["docker", "rm", "-f", cid])
        shutil.rmtree(work, ignore_errors=True)


def lay_out(tree: Path, mount_points: Sequence[str], env: Sequence[tuple[str, str]]) -> None:
    """Charliecloud's layout: /ch/environment, and the directories and files ch-run binds onto where the image lacks
    them (a symlink counts as present).

    The tree is the image's own files, so nothing here follows a link in it: an image whose ``/ch`` or ``/data``
    is a link to an absolute path would otherwise have this machine's files written or created where it points
    (``/ch -> /root/.ssh``). A path with a link on the way is left as it is (ch-run resolves it inside the image);
    /ch/environment through a link is refused (UsageError)."""
    write_atomic(tree / "ch" / "environment", "".join(f"{k}={v}\n" for k, v in env), within=tree)
    for rel in (*CH_DIRS, *(p.strip("/") for p in mount_points)):
        _make_unless_linked(tree, rel, directory=True)
    for rel in CH_FILES:
        _make_unless_linked(tree, rel, directory=False)


def _make_unless_linked(tree: Path, rel: str, *, directory: bool) -> None:
    """Make ``tree/rel`` (its missing directories too) unless it exists or a part of it is a symbolic link."""
    parts = Path(rel).parts
    here = tree
    for i, part in enumerate(parts):
        here = here / part
        if here.is_symlink():
            return
        if here.exists():
            continue
        if directory or i < len(parts) - 1:
            here.mkdir()
        else:
            here.touch()


def _check(result: cmd.Result, ref: str) -> None:
    if result.code != 0:
        raise NodekitError(
            f"converting {ref} failed: {result.message}",
            fix="check free space where [slurm] image_dir points, and that the image is in this machine's engine",
        )
