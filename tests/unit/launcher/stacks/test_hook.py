"""The hook in real processes (nodekit/launcher/stacks/hook.py) and the reader (collect.py): a process armed through
the image's own .pth line dumps its stack on the signal while its main thread is blocked, its progress record moves
when it issues collectives or computes and stands still when it is stuck, and the reader signals nothing it did not
arm. torch.distributed is a stand-in module here (the hook only looks it up in sys.modules); the real one runs in
tests/integration/test_stall.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.launcher.stacks import collect
from nodekit.launcher.stacks.hook import SIGNAL, start_time
from nodekit.launcher.stacks.places import RankStack, place

ROOT = Path(__file__).resolve().parents[4]
JOB = textwrap.dedent(
    """
    import sys, time, types
    from nodekit.launcher.stacks import hook
    hook.PROGRESS_S = 0.05

    class Group:
        issued = 0

        def _get_sequence_number_for_group(self):
            return Group.issued

    dist = types.ModuleType("torch.distributed")
    dist.is_available = dist.is_initialized = lambda: True
    dist.get_rank, dist.get_world_size = (lambda: 3), (lambda: 4)
    c10d = types.ModuleType("torch.distributed.distributed_c10d")
    c10d._world = types.SimpleNamespace(pg_map={Group(): None, Group(): None})
    sys.modules.update({"torch.distributed": dist, "torch.distributed.distributed_c10d": c10d})

    def collectives():
        print("ready", flush=True)
        while True:
            Group.issued += 1
            time.sleep(0.01)

    def compute():
        print("ready", flush=True)
        x = 0
        while True:  # one flat loop: found at the same backward jump at every check, and running
            x = (x * 31 + 7) % 1000003

    def wait_for_the_others():
        print("ready", flush=True)
        time.sleep(600)

    def raises():
        print("ready", flush=True)
        raise RuntimeError("boom on rank 3\\nsecond line of the message")

    def exits():
        print("ready", flush=True)
        sys.exit(3)

    modes = {"collectives": collectives, "compute": compute, "stuck": wait_for_the_others, "raises": raises,
             "exits": exits}
    modes[sys.argv[1]]()
    """
)


def pth_line() -> str:
    """The exit guard's .pth line, exactly as images/Dockerfile writes it into the image's site-packages."""
    found = re.search(r"printf '%s\\n' '([^']+)'", (ROOT / "images" / "Dockerfile").read_text())
    assert found, "images/Dockerfile writes no nodekit-exitguard.pth"
    return found.group(1)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[str]]]]:
    """(the worker directory, started processes): each started like a job's process in the image, the .pth line
    processed at start-up (``site.addsitedir``), with NODEKIT_EXIT_GUARD=1 and NODEKIT_WORKER_DIR set."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "nodekit-exitguard.pth").write_text(pth_line() + "\n")
    (tmp_path / "job.py").write_text(JOB)
    procs: list[subprocess.Popen[str]] = []
    yield tmp_path / "workers", procs
    for p in procs:
        p.kill()
        p.wait()


def start(tmp_path: Path, procs: list[subprocess.Popen[str]], mode: str) -> subprocess.Popen[str]:
    env = os.environ | {"NODEKIT_EXIT_GUARD": "1", "NODEKIT_WORKER_DIR": str(tmp_path / "workers"),
                        "PYTHONPATH": str(ROOT)}  # fmt: skip
    boot = f"import site, runpy, sys; site.addsitedir({str(tmp_path / 'site')!r}); sys.argv = sys.argv[1:]; "
    boot += "runpy.run_path(sys.argv[0], run_name='__main__')"
    p = subprocess.Popen([sys.executable, "-c", boot, str(tmp_path / "job.py"), mode], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline() == "ready\n", "the job did not start"
    return p


def progress_of(directory: Path, pid: int, timeout: float = 10.0) -> collect.Progress:
    deadline = time.monotonic() + timeout
    while pid not in (found := collect.progress(str(directory))):
        assert time.monotonic() < deadline, f"no progress record of {pid}: {os.listdir(directory)}"
        time.sleep(0.02)
    return found[pid]


def test_a_stuck_process_dumps_its_stack_and_its_progress_stands_still(
    job: tuple[Path, list[subprocess.Popen[str]]], tmp_path: Path
) -> None:
    workers, procs = job
    p = start(tmp_path, procs, "stuck")
    first = progress_of(workers, p.pid)
    time.sleep(0.5)
    assert progress_of(workers, p.pid) == first and (first.rank, first.world) == (3, 4)
    [found] = collect.dump_all(str(workers))
    assert found.pid == p.pid and found.rank == 3 and found.world == 4 and found.error is None
    stack = RankStack.of(found, node=1)
    line = next(i for i, ln in enumerate(JOB.splitlines(), 1) if "time.sleep(600)" in ln)
    assert place(stack).text() == f"at {tmp_path}/job.py:{line} in wait_for_the_others", found.dump
    # Nothing of it moved: a dump is written by the signal handler, not by the main thread.
    time.sleep(0.3)
    assert progress_of(workers, p.pid) == first and p.poll() is None


def test_collectives_and_computing_are_progress(job: tuple[Path, list[subprocess.Popen[str]]], tmp_path: Path) -> None:
    workers, procs = job
    issuing, computing = start(tmp_path, procs, "collectives"), start(tmp_path, procs, "compute")
    before = {p.pid: progress_of(workers, p.pid) for p in (issuing, computing)}
    time.sleep(0.6)
    after = {p.pid: progress_of(workers, p.pid) for p in (issuing, computing)}
    assert after[issuing.pid].calls > before[issuing.pid].calls  # both groups' sequence numbers, summed
    assert after[computing.pid].moves > before[computing.pid].moves
    assert after[computing.pid].calls == before[computing.pid].calls == 0


def test_the_reader_signals_only_processes_that_armed_the_hook(tmp_path: Path) -> None:
    workers = tmp_path / "w"
    workers.mkdir()
    bystander = subprocess.Popen(["sleep", "30"])  # the signal's default action would end it
    try:
        head = {"pid": bystander.pid, "start": start_time(bystander.pid), "main": 1, "signal": int(SIGNAL)}
        (workers / f"{bystander.pid}.stack").write_text(json.dumps(head) + "\n")
        gone = {"pid": 999999, "start": 1, "main": 1, "signal": int(SIGNAL)}
        (workers / "999999.stack").write_text(json.dumps(gone) + "\n")
        (workers / "999999.progress").write_text('{"rank": 0, "world": 1, "calls": 0, "moves": 0}\n')
        reused = dict(head, start=(head["start"] or 0) + 1)  # a pid reused by another process
        (workers / f"{os.getpid()}.stack").write_text(json.dumps(dict(reused, pid=os.getpid())) + "\n")
        [found] = collect.dump_all(str(workers), timeout_s=0.5)
        assert found.pid == bystander.pid and found.dump == ""
        assert found.error == "the stack dump is not armed in this process (its handler was replaced)"
        assert bystander.poll() is None
        collect.prune(str(workers))
        assert sorted(os.listdir(workers)) == [".lock", f"{bystander.pid}.stack"]
    finally:
        bystander.kill()
        bystander.wait()


def test_two_readers_at_once_each_read_a_whole_dump(
    job: tuple[Path, list[subprocess.Popen[str]]], tmp_path: Path
) -> None:
    workers, procs = job
    start(tmp_path, procs, "stuck")
    results: list[list[collect.Process]] = []
    readers = [threading.Thread(target=lambda: results.append(collect.dump_all(str(workers)))) for _ in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    assert [len(r) for r in results] == [1, 1]
    for [found] in results:
        assert found.dump.count("wait_for_the_others") == 1, found.dump


def test_the_reader_prints_its_json_for_the_host(job: tuple[Path, list[subprocess.Popen[str]]], tmp_path: Path) -> None:
    workers, procs = job
    p = start(tmp_path, procs, "stuck")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "nodekit.launcher.stacks", "--dir", str(workers)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    [found] = collect.from_json(out.stdout)
    assert found.pid == p.pid and "wait_for_the_others" in found.dump and found.command.startswith(sys.executable)
    bad = subprocess.run([sys.executable, "-m", "nodekit.launcher.stacks", "--bogus"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "usage:" in bad.stderr
    with pytest.raises(ValueError, match="not nodekit's stack format 1"):
        collect.from_json('{"format": 2, "processes": []}')


def test_a_process_without_the_guard_or_the_directory_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "nodekit-exitguard.pth").write_text(pth_line() + "\n")
    code = (
        f"import os, site, sys; site.addsitedir({str(tmp_path / 'site')!r}); "
        "armed = 'nodekit.launcher.stacks.hook' in sys.modules; "
        "from nodekit.launcher.stacks.collect import _catches; from nodekit.launcher.stacks.hook import SIGNAL; "
        "print(armed, _catches(os.getpid(), SIGNAL))"
    )
    for extra in ({"NODEKIT_EXIT_GUARD": "0", "NODEKIT_WORKER_DIR": str(tmp_path / "w")}, {"NODEKIT_EXIT_GUARD": "1"}):
        env = {k: v for k, v in os.environ.items() if k != "NODEKIT_WORKER_DIR"} | extra | {"PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.stdout.split() == ["False", "False"], (extra, out.stdout, out.stderr)
    assert not (tmp_path / "w").exists()
    assert signal.SIGRTMIN + 7 == SIGNAL


def test_an_exception_that_ends_a_process_is_kept_for_the_launcher(
    job: tuple[Path, list[subprocess.Popen[str]]], tmp_path: Path
) -> None:
    """What the launcher publishes with its done mark, so that main's last line quotes a rank on another machine."""
    workers, procs = job
    raising, exiting = start(tmp_path, procs, "raises"), start(tmp_path, procs, "exits")
    assert raising.wait(timeout=30) == 1 and exiting.wait(timeout=30) == 3
    out = raising.stdout.read() if raising.stdout else ""
    assert "Traceback" in out and "RuntimeError: boom on rank 3" in out  # printed as before, by the hook it chained
    assert collect.raised(str(workers), raising.pid) == "RuntimeError: boom on rank 3"
    assert collect.raised(str(workers), exiting.pid) == ""  # sys.exit(3) is no exception to quote
    collect.prune(str(workers))  # the process has ended; what it raised is read after torchrun gave up on it
    assert collect.raised(str(workers), raising.pid) == "RuntimeError: boom on rank 3"
    assert f"{raising.pid}.stack" not in os.listdir(workers)
