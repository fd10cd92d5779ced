"""The image as a file on the shared path, made from this machine's Docker engine (no registry).

- charliecloud: ``ch-convert -i docker -o dir`` (Charliecloud's own export: the image's files and its environment
  in /ch/environment), the container's mount points added (``ch-run`` binds onto existing directories only, and a
  SquashFS is read-only), then ``mksquashfs`` with lz4: see docs/scale.md for the measurements behind that choice;
- pyxis: ``enroot import -o FILE dockerd://REF`` (enroot's own SquashFS; not installable here, so never run in CI).

The file is written under a temporary name next to its place and renamed when complete: an interrupted conversion
never leaves a file that looks done. Its name carries the image id (``submit.image_file``), which makes the shared
directory a cache: the next job of the same image finds it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from nodekit.errors import NodekitError
from nodekit.slurm import cmd

CONVERT_S = 3600.0  # a CUDA image (10 GB and more) on a small machine
# Mount points Charliecloud's own dir -> squash conversion makes (ch-convert's mount_points_ensure).
CH_DIRS = ("bin", "dev", "etc", "mnt", "proc", "usr", *(f"mnt/{i}" for i in range(10)))
CH_FILES = ("etc/hosts", "etc/resolv.conf")
# lz4: a few times faster to make than ch-convert's gzip at a somewhat larger file (docs/scale.md).
MKSQUASHFS = ("-b", "65536", "-noappend", "-all-root", "-comp", "lz4", "-quiet", "-no-progress")


def convert(ref: str, dest: Path, mode: str, mount_points: tuple[str, ...]) -> float:
    """Make ``dest`` from ``ref``; the seconds it took. Raises NodekitError with the tool's own message."""
    started = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        if mode == "pyxis":
            _check(cmd.run(["enroot", "import", "-o", str(partial), f"dockerd://{ref}"], timeout=CONVERT_S), ref)
        else:
            _charliecloud(ref, partial, mount_points)
        partial.replace(dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return time.monotonic() - started


def _charliecloud(ref: str, out: Path, mount_points: tuple[str, ...]) -> None:
    # The unpacked tree next to the output (same file system, which is sized for images), removed afterwards.
    tree = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)) / "img"
    try:
        argv = ["ch-convert", "--tmp", str(tree.parent), "-i", "docker", "-o", "dir", ref, str(tree)]
        _check(cmd.run(argv, timeout=CONVERT_S), ref)
        add_mount_points(tree, mount_points)
        _check(cmd.run(["mksquashfs", str(tree), str(out), *MKSQUASHFS], timeout=CONVERT_S), ref)
    finally:
        shutil.rmtree(tree.parent, ignore_errors=True)


def add_mount_points(tree: Path, mount_points: tuple[str, ...]) -> None:
    """The directories and files ch-run binds onto, where the image lacks them (a symlink counts as present)."""
    for rel in (*CH_DIRS, *(p.strip("/") for p in mount_points)):
        path = tree / rel
        if not path.is_symlink() and not path.exists():
            path.mkdir(parents=True)
    for rel in CH_FILES:
        path = tree / rel
        if not path.is_symlink() and not path.exists():
            path.touch()


def _check(result: cmd.Result, ref: str) -> None:
    if result.code != 0:
        raise NodekitError(
            f"converting {ref} failed: {result.message}",
            fix="check free space where [slurm] image_dir points, and that the image is in this machine's engine",
        )
