"""nodekit top's sampler: the real script read against this machine's /proc and cgroups (a stand-in ``docker`` on
PATH names this test's own process as the job's container), and the pure side: ticks into rates, quiet nodes,
Docker's timestamps, nvidia-smi's lines, and the command line of each kind of host."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from nodekit.backends.fleet import sampler
from nodekit.backends.fleet.hosts import parse_host
from nodekit.backends.fleet.targets import Target
from nodekit.backends.fleet.top import session_argv


def fake_docker(bin_dir: Path, pid: int, log_path: str) -> Path:
    """A ``docker`` that knows one container (``pid``'s, its json-file at ``log_path``) and logs each call."""
    bin_dir.mkdir(exist_ok=True)
    calls = bin_dir / "calls"
    script = f"""#!/bin/sh
echo "$1" >> {calls}
case "$1" in
  ps) echo 0123abc ;;
  inspect) echo "{pid} running 2026-11-24T15:30:12.5Z 0001-01-01T00:00:00Z 0 {log_path}" ;;
  logs) echo "2026-11-24T15:30:40.25Z step 41"; echo "2026-11-24T15:30:41.000000001Z step 42" ;;
esac
"""
    (bin_dir / "docker").write_text(script)
    (bin_dir / "docker").chmod(0o755)
    return calls


def sample(tmp_path: Path, ticks: int, pid: int, log_path: str = "") -> sampler.NodeView:
    fake_docker(tmp_path / "bin", pid, log_path)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    args = sampler.samplers_args("proj", 0.2, 0.2, counters=True)
    child = subprocess.Popen(["sh", "-c", sampler.SCRIPT, "nodekit-top", *args], stdout=subprocess.PIPE, env=env,
                             text=True)  # fmt: skip
    view = sampler.NodeView(rank=0, where="here")
    done = 0
    try:
        assert child.stdout is not None
        for line in child.stdout:
            done += view.feed(line)
            if done == ticks:
                break
    finally:
        child.kill()
        child.wait()
    return view


def test_the_script_reads_a_real_processs_counters_here(tmp_path: Path) -> None:
    log = tmp_path / "c-json.log"
    log.write_text('{"log":"step 41\\n","stream":"stdout","time":"2026-11-24T15:30:40.25Z"}\n'
                   '{"log":"step 42\\r\\n","stream":"stderr","time":"2026-11-24T15:30:41.000000001Z"}\n')  # fmt: skip
    view = sample(tmp_path, 4, os.getpid(), str(log))
    r = sampler.row(view)
    assert r.state == "running" and r.since == "2026-11-24T15:30:12"
    assert r.host == Path("/proc/sys/kernel/hostname").read_text().strip()
    assert r.cpu_pct is not None and r.cpu_pct >= 0
    assert r.rx_bps is not None and r.tx_bps is not None
    assert r.last_line == "step 42" and r.line_age_s is not None
    assert view.mem_total is not None and view.mem_total > 2**20
    cgroup = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    paths = [line.split(":", 2)[2] for line in cgroup.splitlines()]
    files = [f"/sys/fs/cgroup{p}/memory.current" for p in paths] + [
        f"/sys/fs/cgroup/memory{p}/memory.usage_in_bytes" for p in paths
    ]
    has_mem = any(Path(f).is_file() for f in files)
    assert (r.mem_bytes is not None) == has_mem
    # The docker CLI ran twice in four ticks (finding the container), never per tick: the last line is the file's.
    assert (tmp_path / "bin" / "calls").read_text().split() == ["ps", "inspect"]


def test_without_a_readable_log_file_docker_logs_reads_the_last_line_now_and_then(tmp_path: Path) -> None:
    view = sample(tmp_path, 2, os.getpid(), "/nonexistent/c-json.log")
    assert view.last_line == "step 42"
    assert (tmp_path / "bin" / "calls").read_text().split() == ["ps", "inspect", "logs"]


def test_a_container_that_ended_reports_its_state_and_no_counters(tmp_path: Path) -> None:
    view = sample(tmp_path, 2, 0)
    r = sampler.row(view)
    assert r.state == "running" and r.cpu_pct is None and r.mem_bytes is None  # pid 0: nothing to read


def view_of(lines: str) -> sampler.NodeView:
    v = sampler.NodeView(rank=1, where="root@h1")
    for line in lines.strip().splitlines():
        v.feed(line)
    return v


def test_two_ticks_make_rates_on_the_nodes_own_clock() -> None:
    v = view_of("""
        clock 1795534098 100.0
        host h1 16000000
        state running 2026-11-24T15:30:12.5Z 0001-01-01T00:00:00Z 0
        t 200.0
        cpu 1000000000
        mem 3000000000 1000000000
        net 1000 2000
        log 2026-11-24T15:29:30Z hello
        end
        t 202.0
        cpu 4000000000
        mem 5000000000 1000000000
        net 5096 10192
        gpu 0, 97, 30000, 81559, 250.12
        gpu 1, [N/A], 10, 81559, [N/A]
        end
    """)
    r = sampler.row(v)
    assert r.cpu_pct == pytest.approx(150.0)
    assert r.mem_bytes == 4_000_000_000 and r.mem_pct == pytest.approx(100 * 4e9 / 16.384e9)
    assert (r.rx_bps, r.tx_bps) == (2048.0, 4096.0)
    assert [(g.index, g.util, g.power_w) for g in r.gpus] == [(0, 97.0, 250.12), (1, None, None)]
    # The node's clock at the last tick: 1795534098 - 100 + 202 = 1795534200 (15:30:00Z), the line's 15:29:30Z.
    assert r.line_age_s == pytest.approx(30.0)


def test_a_torn_line_is_passed_over() -> None:
    v = view_of("t 1.0\ncpu 12x\nend\nt 2.0\ncpu 5\nend")
    assert [t.cpu_ns for t in v.ticks] == [None, 5]


def test_docker_timestamps() -> None:
    assert sampler.docker_time("2026-11-24T15:30:12.123456789Z") == pytest.approx(1795534212.123456789)
    assert sampler.docker_time("1970-01-01T00:00:01Z") == 1.0
    assert sampler.docker_time("") is None and sampler.docker_time("step 42") is None


def row(rank: int, age: float, cpu: float, state: str = "running") -> sampler.Row:
    return sampler.Row(rank=rank, host=f"h{rank}", state=state, cpu_pct=cpu, line_age_s=age)


@pytest.mark.parametrize(
    ("rows", "quiet"),
    [
        ([row(0, 2, 180), row(1, 3, 175), row(2, 95, 1)], {2}),  # node 2: silent for 95 s, idle, while the others work
        ([row(0, 2, 180), row(1, 3, 175), row(2, 95, 150)], set()),  # silent but busy: a long step, not stuck
        ([row(0, 2, 180), row(1, 3, 175), row(2, 30, 1)], set()),  # idle but spoke 30 s ago: under a minute
        ([row(0, 90, 1), row(1, 95, 1), row(2, 95, 1)], set()),  # all quiet (a checkpoint): nobody stands out
        ([row(0, 200, 0)], set()),  # one node: nothing to compare with
        ([row(0, 2, 180), row(1, 3, 175), row(2, 95, 1, state="exited (0)")], set()),  # ended: not quiet
    ],
)
def test_a_node_that_went_quiet_while_the_others_progress_is_marked(rows: list[sampler.Row], quiet: set[int]) -> None:
    assert {r.rank for r in sampler.mark_quiet(rows) if r.quiet} == quiet


def test_each_kind_of_host_gets_its_own_command_line() -> None:
    ssh_target = Target(2, "nodekit-demo-node2", parse_host("ssh://me@10.0.0.7:2222", 2))
    argv, env = session_argv(ssh_target, 2.0)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ServerAliveInterval=10" in " ".join(argv)
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "me" and env == {}
    assert argv[-2:-1] == ["10.0.0.7"]
    remote = shlex.split(argv[-1])
    assert remote[:2] == ["sh", "-c"] and remote[2] == sampler.SCRIPT
    assert remote[3:] == ["nodekit-top", "nodekit-demo-node2", "2", "2", "5", "15", "1"]
    argv, env = session_argv(Target(0, "p0"), 1.0)
    assert argv[:3] == ["sh", "-c", sampler.SCRIPT] and argv[-1] == "1" and env == {}
    argv, env = session_argv(Target(1, "p1", parse_host("tcp://10.0.0.8:2375", 1)), 1.0)
    assert env == {"DOCKER_HOST": "tcp://10.0.0.8:2375"} and argv[-1] == "0", "a tcp:// engine's counters are not here"
