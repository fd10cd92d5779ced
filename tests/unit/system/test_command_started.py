"""`nodekit run`'s "N s since the command" counts from the process's start, the interpreter's and the CLI's own
start-up included, not from the moment the run's code was reached."""

from __future__ import annotations

import subprocess
import sys


def test_the_command_started_when_its_process_did() -> None:
    code = (
        "import time; time.sleep(0.6)\n"
        "from nodekit.system.progress import command_started\n"
        "print(time.monotonic() - command_started())\n"
    )
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.6 <= age < 5, age  # the sleep before the call counts; the clock's ticks are 10 ms
