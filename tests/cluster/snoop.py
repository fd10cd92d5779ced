"""What another, unprivileged local user sees of a running job: every process's arguments (``/proc/PID/cmdline`` is
readable by all users, its environment is not) and the files it may read. Used by the tests that no job secret is
ever in either (issue 28)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

USER, GROUP = "nobody", "nogroup"
PYTHON = "/usr/bin/python3"  # the system's: readable by every user, unlike a checkout's virtual environment

_CMDLINES = """
import json, os
found = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[pid] = f.read().decode(errors="replace")
        except OSError:
            pass
print(json.dumps(found))
"""

_FILES = """
import json, os, sys
needle = sys.stdin.read()
seen, found = 0, []
for root in sys.argv[1:]:
    for d, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            try:
                with open(path, "rb") as f:
                    seen += 1
                    if needle.encode() in f.read(1 << 20):
                        found.append(path)
            except OSError:
                pass
print(json.dumps({"seen": seen, "found": found}))
"""


def _as_user(code: str, *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        ["setpriv", f"--reuid={USER}", f"--regid={GROUP}", "--clear-groups", PYTHON, "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def cmdlines() -> dict[int, str]:
    """Every process's arguments as user ``nobody`` reads them (NUL-separated words joined by NUL)."""
    return {int(pid): line for pid, line in json.loads(_as_user(_CMDLINES)).items()}


def processes_showing(secret: str) -> list[str]:
    """The processes whose arguments hold ``secret``, as another user sees them (empty when none)."""
    return [f"{pid}: {line.replace(chr(0), ' ')[:300]}" for pid, line in cmdlines().items() if secret in line]


def readable_files_holding(secret: str, roots: Sequence[Path]) -> tuple[int, list[str]]:
    """How many files under ``roots`` user ``nobody`` can read, and those that hold ``secret``."""
    got = json.loads(_as_user(_FILES, *map(str, roots), stdin=secret))  # never an argument itself
    return int(got["seen"]), list(got["found"])
