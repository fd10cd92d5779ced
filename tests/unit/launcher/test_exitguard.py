"""The exit guard in real Python processes: a finished script exits 0 even when finalisation would abort; a failed
one keeps its code. The guard is loaded by the very line the image's .pth file holds (read from images/Dockerfile),
here from a sitecustomize module, which Python imports at start-up just after the .pth files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The script's last act before the interpreter finalises: an object whose destructor aborts at module teardown,
# as torch's gloo process group now and then does ("terminate called without an active exception", exit 134).
# It is held by sys.modules, which finalisation clears whatever else still refers to the script's globals (a
# global of __main__ is not enough: the guard itself keeps __main__'s frame, and with it that object, alive).
SCRIPT = """
import atexit, os, sys
mode = sys.argv[1]
atexit.register(lambda: print("user atexit ran", flush=True))
log = open(sys.argv[2], "w")
log.write("unflushed " + mode)

class AbortsInTeardown:
    def __del__(self):
        os.abort()

if mode in ("finish", "exit0", "exit_main0", "exit_in_main0"):
    sys.modules["nodekit_test_aborts_in_teardown"] = AbortsInTeardown()
import json  # the first import of a module not yet loaded, as every training script makes (torch)

def main():
    if mode == "raise":
        raise RuntimeError("boom")
    if mode == "exit_in_main0":
        sys.exit(0)
    return 3 if mode in ("return3", "raise3") else 0

if mode == "exit0":
    sys.exit(0)
if mode in ("exit_main0", "exit_in_main0"):
    sys.exit(main())  # the usual ending: ``if __name__ == "__main__": sys.exit(main())``
if mode == "exit4":
    sys.exit(4)
if mode == "raise3":
    raise SystemExit(main())
if mode == "return3":
    sys.exit(main())
def library_call():
    try:
        sys.exit(0)  # as a library (or torchrun) may, caught inside it
    except SystemExit:
        pass

if mode == "caught0":
    library_call()
    raise SystemExit(5)
main()
"""


def _pth_line() -> str:
    text = (ROOT / "images" / "Dockerfile").read_text()
    m = re.search(r"printf '%s\\n' '([^']+)'", text)
    assert m, "the Dockerfile no longer writes the exit guard's .pth line"
    return m.group(1)


def _run(tmp_path: Path, mode: str, guard: str | None) -> tuple[int, str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_pth_line() + "\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "NODEKIT_EXIT_GUARD"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    if guard is not None:
        env["NODEKIT_EXIT_GUARD"] = guard
    out = tmp_path / f"{mode}.log"
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(out)], env=env, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout, out.read_text()


@pytest.mark.parametrize("mode", ["finish", "exit0", "exit_main0", "exit_in_main0"])
def test_a_finished_script_exits_0_although_its_teardown_aborts(tmp_path: Path, mode: str) -> None:
    assert _run(tmp_path, mode, guard="0")[0] == -6  # without the guard: SIGABRT in finalisation
    code, stdout, log = _run(tmp_path, mode, guard="1")
    assert code == 0
    assert "user atexit ran" in stdout  # the script's own atexit handlers still run (the guard's runs last)
    assert log == f"unflushed {mode}"  # open files are flushed although finalisation is skipped


@pytest.mark.parametrize(
    ("mode", "expected"), [("exit4", 4), ("raise3", 3), ("return3", 3), ("raise", 1), ("caught0", 5)]
)
def test_a_failed_script_keeps_its_code(tmp_path: Path, mode: str, expected: int) -> None:
    code, stdout, log = _run(tmp_path, mode, guard="1")
    assert code == expected
    assert "user atexit ran" in stdout
    assert log == f"unflushed {mode}"
