"""`make bench` (part): the same-data check's cost. Targets (issue 8): a manifest (paths and sizes) of 100,000
small files in under 2 s; content hashing at disk speed (compared with reading the same bytes without hashing,
and with the page cache both warm, as after a first epoch, and as the files were just written).

Prints one line per measurement and, with --write, appends a section to docs/manifest-benchmark.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodekit.launcher.datacheck.manifest import manifest


def make_tree(root: Path, files: int, size: int) -> None:
    payload = os.urandom(size)
    per_dir = 1000
    for i in range(files):
        d = root / f"d{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir()
        (d / f"f{i:06d}.bin").write_bytes(payload[: size - (i % 7)])


def make_big(root: Path, mib: int) -> None:
    chunk = os.urandom(1 << 20)
    with open(root / "big.bin", "wb") as f:
        for _ in range(mib):
            f.write(chunk)


def read_all(root: Path) -> int:
    n = 0
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while b := f.read(1 << 20):
                    n += len(b)
    return n


def timed(fn, *args, **kw):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--dir", default=None, help="where to make the trees (default: a temporary directory)")
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        small, big = Path(tmp) / "small", Path(tmp) / "big"
        small.mkdir()
        big.mkdir()
        make_tree(small, args.files, args.size)
        make_big(big, args.big_mib)
        entries, t_sizes = timed(manifest, str(small))
        assert len(entries) == args.files
        lines.append(
            f"manifest, paths and sizes, {args.files:,} files of ~{args.size} B: {t_sizes:.2f} s (target < 2 s)"
        )
        _, t_small_hash = timed(manifest, str(small), hashes=True)
        lines.append(f"manifest with content hashes, same {args.files:,} files: {t_small_hash:.2f} s")
        nbytes, t_read = timed(read_all, big)
        _, t_hash = timed(manifest, str(big), hashes=True)
        mib = nbytes / (1 << 20)
        lines.append(
            f"content hashing, one {mib:.0f} MiB file (page cache warm): {mib / t_hash:.0f} MiB/s hashed vs "
            f"{mib / t_read:.0f} MiB/s read without hashing"
        )
    for line in lines:
        print(line)
    return 0 if t_sizes < 2.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
