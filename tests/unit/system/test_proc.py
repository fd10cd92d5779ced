"""The one process runner (nodekit/system/proc/), with real processes: deadlines, the environment children get, and the
hook a signal handler will use to end every child (process groups, SIGTERM then SIGKILL)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from nodekit.errors import DeadlineError
from nodekit.system import proc
from tests.factories import gone


def test_run_captures_and_passes_the_environment_it_is_given() -> None:
    before = proc.live()  # the suite's earlier tiers run in this process too
    done = proc.run(["sh", "-c", 'echo "out $X"; echo err >&2; exit 3'], deadline=10, what="sh", fix="",
                    env={"X": "given", "PATH": os.environ["PATH"]})  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (3, "out given\n", "err\n")
    assert done.argv[0] == "sh"
    assert proc.live() == before, "a finished run is no longer listed"


def test_run_stops_at_its_deadline_with_one_line() -> None:
    before = proc.live()
    started = time.monotonic()
    with pytest.raises(DeadlineError) as e:
        proc.run(["sleep", "30"], deadline=0.3, what="the sleeper", fix="wake it")
    assert time.monotonic() - started < 5
    assert e.value.one_line() == "the sleeper did not finish within 0.3 s and was stopped (it hung). Fix: wake it"
    assert e.value.exit_code == 1 and proc.live() == before


def test_extra_env_reaches_children_and_leaves_os_environ_alone() -> None:
    before = dict(os.environ)
    with proc.extra_env({"NODEKIT_TEST_OVERLAY": "on", "PATH": f"/nk-wrappers:{os.environ['PATH']}"}):
        assert "NODEKIT_TEST_OVERLAY" not in os.environ and os.environ == before
        seen = proc.run(["sh", "-c", 'echo "$NODEKIT_TEST_OVERLAY $PATH"'], deadline=10, what="sh", fix="").stdout
        assert seen.startswith("on /nk-wrappers:")
        # What python-on-whales starts gets the same variables, as a prefix of its command line.
        assert proc.command_prefix(None)[:2] == ["env", "NODEKIT_TEST_OVERLAY=on"]
    assert proc.environ().get("NODEKIT_TEST_OVERLAY") is None and proc.overlay() == {}
    assert proc.command_prefix(None) == []


def test_the_deadline_prefix_is_gnu_timeouts_and_its_stop_is_recognised() -> None:
    if not proc.gnu_timeout():
        pytest.skip("no GNU timeout(1) here: such calls run without a deadline")
    prefix = proc.command_prefix(2.5)
    assert prefix == ["timeout", "--foreground", "--kill-after=5", "2.5"]
    assert proc.command_prefix(proc.Unbounded("follows the job's log")) == []
    code = proc.run([*proc.command_prefix(0.3), "sleep", "30"], deadline=10, what="sleep", fix="").returncode
    assert proc.stopped(code) and not proc.stopped(0) and not proc.stopped(1)


def test_terminate_all_ends_each_childs_whole_group_then_kills_what_ignores_term() -> None:
    """The hook for a signal handler: every live child and what it started in its own process group end, a
    child that ignores SIGTERM is killed after the grace, and nothing stays listed."""
    polite = proc.start(["sh", "-c", "sleep 60 & echo $!; wait"], deadline=proc.Unbounded("ended by the test"),
                        what="polite", stdout="pipe", group=True)  # fmt: skip
    stubborn = proc.start(["sh", "-c", "trap '' TERM; sleep 60 & echo $!; wait"], deadline=60, what="stubborn",
                          stdout="pipe", group=True)  # fmt: skip
    plain = proc.start(["sleep", "60"], deadline=60, what="plain")
    assert polite.stdout is not None and stubborn.stdout is not None
    grandchildren = [int(polite.stdout.readline()), int(stubborn.stdout.readline())]
    assert os.getpgid(grandchildren[0]) == polite.pid and os.getpgid(grandchildren[1]) == stubborn.pid
    assert plain.group is False and os.getpgid(plain.pid) == os.getpgid(0)
    assert {c.what for c in proc.live()} >= {"polite", "stubborn", "plain"}

    started = time.monotonic()
    assert proc.terminate_all(grace=0.5) >= 3
    assert time.monotonic() - started < 10
    assert polite.returncode == -15 and stubborn.returncode == -9 and plain.returncode == -15
    assert all(gone(p) for p in grandchildren), "a grandchild in the group outlived terminate_all"
    assert proc.live() == []


def test_a_child_in_its_own_group_is_not_reached_by_a_signal_to_ours_and_end_reaches_its_group() -> None:
    child = proc.start(["sh", "-c", "sleep 60 & echo $!; wait"], deadline=60, what="grouped", stdout="pipe",
                       group=True)  # fmt: skip
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    assert child.end(grace=2) == -15
    assert gone(grandchild) and proc.live() == []


def test_a_program_that_does_not_exist_is_an_oserror_and_nothing_is_listed() -> None:
    with pytest.raises(OSError):
        proc.run(["/nonexistent/nodekit-no-such-program"], deadline=5, what="x", fix="")
    assert proc.live() == []


def test_only_the_runner_and_the_launcher_start_processes() -> None:
    """ruff's banned-api table says the same for most of nodekit/; this also covers nodekit/cli/, which that table
    exempts (for rich), and the os/pty/asyncio ways to start a process."""
    import ast

    root = Path(__file__).resolve().parents[3] / "nodekit"
    spawners = {"system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnl", "execv", "execvp", "execvpe",
                "execl", "execlp", "create_subprocess_exec", "create_subprocess_shell"}  # fmt: skip
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith(("nodekit/system/proc/", "nodekit/launcher/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{rel}:{node.lineno} {m}" for m in modules if m.split(".")[0] in ("subprocess", "pty")]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in spawners
                and ast.unparse(node.value) in ("os", "asyncio")
            ):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert found == [], "start processes through nodekit.system.proc: " + ", ".join(found)


def test_a_stop_signal_ends_every_child_group_and_raises_interrupted_with_128_plus_the_signal() -> None:
    """What the CLI installs around every command (SIGHUP, SIGINT, SIGTERM alike): the children's groups end first,
    then Interrupted unwinds the command (its own cleanup), and the previous handlers come back."""
    import signal

    child = proc.start(["sh", "-c", "sleep 60 & echo $!; wait"], deadline=proc.Unbounded("ended by the signal"),
                       what="grouped", stdout="pipe", group=True)  # fmt: skip
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(proc.Interrupted) as e, proc.stopping(grace=1) as received:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)  # the handler raises here
    assert (e.value.exit_code, e.value.name, received) == (129, "SIGHUP", [signal.SIGHUP])
    assert isinstance(e.value, KeyboardInterrupt), "every Ctrl-C cleanup path handles it"
    assert child.returncode == -15 and gone(grandchild) and proc.live() == []
    assert signal.getsignal(signal.SIGHUP) == before


def test_a_command_that_fails_leaves_no_child_of_its_own_running() -> None:
    with pytest.raises(RuntimeError), proc.stopping(grace=1):
        proc.start(["sleep", "60"], deadline=60, what="left behind by a thread", group=True)
        raise RuntimeError("the command failed")
    assert proc.live() == []


def test_a_stall_deadline_stops_a_stream_that_stands_still_but_not_a_slow_reader() -> None:
    """A stall deadline counts only the time a read blocks: a reader busy elsewhere (feeding slow targets) for longer
    than the deadline is not a stall; a source that gives nothing for that long is, and it is named."""
    child = proc.start(["sh", "-c", "echo one; sleep 0.6; echo two; exec sleep 30"], deadline=proc.Stall(0.4),
                       what="docker save nodekit/x:1", fix="check the engine", stdout="pipe", group=True)  # fmt: skip
    assert child.stdout is not None
    got = []
    started = time.monotonic()
    while True:
        with child.waiting():
            line = child.stdout.readline()
        if not line:
            break
        got.append(line)
        time.sleep(0.5)  # busy elsewhere, longer than the deadline: does not count
    child.wait()
    assert got == [b"one\n", b"two\n"] and time.monotonic() - started < 10
    with pytest.raises(DeadlineError) as e:
        child.check()
    assert e.value.one_line() == (
        "docker save nodekit/x:1 made no progress for 0.4 s and was stopped (it hung). Fix: check the engine"
    )
    assert proc.live() == []


@pytest.mark.parametrize("pid", [2**70, 2**31, 0, -1, "1", True])
def test_a_pid_no_process_can_have_is_not_alive(pid: Any) -> None:
    """A pid read from a file (a run record, a directory's name) may be anything: os.kill raised OverflowError for
    2**70, and 0 or -1 name process groups, which "exist"."""
    assert proc.alive(pid) is False
    assert proc.alive(os.getpid()) is True
