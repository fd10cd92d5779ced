"""Stand-in programs for the fleet's SSH commands, run for real by ``sh`` (the follower, the start, the opening)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from nodekit.system import proc


@contextlib.contextmanager
def on_path(tmp_path: Path, programs: Mapping[str, str]) -> Iterator[Path]:
    """Each of ``programs`` (name: script text) first on the PATH of what nodekit starts, with $CALLS naming the file
    they log to (made empty); yields its path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in programs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    with proc.extra_env({"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)}):
        yield calls
