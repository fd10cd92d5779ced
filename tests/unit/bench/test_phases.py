"""benchmarks/phases.py and the pure parts of benchmarks/decide.py, on sample text of what the real producers write
(examples/ddp/train.py --step-times, the launcher's preflight line, cgroup counters, docker inspect)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import decide, phases, stats

STEP_TIMES = """\
# time.monotonic() seconds, rank 0
start 100.500000
init 101.250000
step 102.000000
step 102.010000
step 102.020000
step 102.530000
step 102.540000
end 102.700000
"""


def test_step_times_parse_and_split_into_phases() -> None:
    t = phases.parse_step_times(STEP_TIMES)
    assert (t.start, t.init, t.end) == (100.5, 101.25, 102.7)
    assert t.steps == (102.0, 102.01, 102.02, 102.53, 102.54)
    p = phases.split(98.0, 103.0, t)
    assert p.to_main == pytest.approx(2.5)
    assert p.to_init == pytest.approx(3.25)
    assert p.startup == pytest.approx(4.0)
    # The 0.51 s across the epoch boundary (checkpoint) does not move the median step.
    assert p.per_step == pytest.approx(0.01)
    assert p.loop == pytest.approx(0.54)
    assert p.teardown == pytest.approx(0.46)
    assert p.whole == pytest.approx(5.0)
    assert p.steps == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("start 1\ninit 2\nend 3\n", "no step line"),
        ("start 1\nstep 2\nend 3\n", "no init"),
        ("start 1\ninit 2\nstep x\nend 3\n", "not a number"),
        ("start 1\ninit 2\nstep 3\nlap 4\nend 5\n", "line 4"),
        ("start 1\ninit 2\nstep 4\nstep 3\nend 5\n", "increasing"),
    ],
)
def test_bad_step_times_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(phases.ParseError, match=message):
        phases.parse_step_times(text)


def test_times_from_another_clock_are_refused() -> None:
    t = phases.parse_step_times(STEP_TIMES)
    with pytest.raises(phases.ParseError, match="out of order"):
        phases.split(5000.0, 5010.0, t)  # a container with its own monotonic clock would look like this


def test_preflight_seconds_from_the_launcher_log() -> None:
    log = (
        "nodekit: node 0 of 2, main 127.0.0.1:29710\n"
        "nodekit: preflight ok: 2 nodes, same stack (torch 2.13.0, python 3.11.2) (preflight 0.4 s)\n"
        "ddp-demo: first step done (epoch 0)\n"
    )
    assert phases.parse_preflight(log) == 0.4
    assert phases.parse_preflight("ddp-demo: first step done (epoch 0)\n") is None
    assert phases.parse_preflight_settled(log) is None  # a launcher from before the own-cost figure
    now = (
        "nodekit preflight: ok, 2/2 nodes, identical stacks (...) (preflight 2.3 s, 41 ms once every node was there)\n"
    )
    assert phases.parse_preflight(now) == 2.3
    assert phases.parse_preflight_settled(now) == 0.041


def test_cgroup_counters_v1_and_v2() -> None:
    assert phases.parse_cpu("8340000123\n", "v1") == pytest.approx(8.340000123)
    v2 = "usage_usec 8340000\nuser_usec 6000000\nsystem_usec 2340000\nnr_periods 0\n"
    assert phases.parse_cpu(v2, "v2") == pytest.approx(8.34)
    with pytest.raises(phases.ParseError):
        phases.parse_cpu("user_usec 1\n", "v2")
    with pytest.raises(phases.ParseError):
        phases.parse_cpu("max\n", "v1")


def test_cgroup_candidates_cover_both_drivers_and_versions() -> None:
    files = phases.cgroup_cpu_files("abc", root="/cg")
    assert files[0] == ("/cg/cpuacct/docker/abc/cpuacct.usage", "v1")
    assert ("/cg/system.slice/docker-abc.scope/cpu.stat", "v2") in files
    assert ("/cg/docker/abc/cpu.stat", "v2") in files


def test_docker_times_keep_nanoseconds() -> None:
    t = phases.parse_docker_time("2026-11-22T16:50:01.123456789Z")
    assert t == pytest.approx(1795366201.123456789, abs=1e-6)
    assert phases.parse_docker_time("2026-11-22T17:50:01+01:00") == pytest.approx(1795366201.0)
    with pytest.raises(phases.ParseError):
        phases.parse_docker_time("yesterday")


def _run(side: str, whole: float, step: float, cpu: float, **detail: object) -> decide.Run:
    p = phases.Phases(to_main=1.0, to_init=2.0, startup=3.0, per_step=step, loop=whole - 4, teardown=1.0,
                      whole=whole, steps=100)  # fmt: skip
    return decide.Run(side, p, cpu, dict(detail))


def test_rows_and_table_give_verdicts_against_the_issue_targets() -> None:
    bare = [_run("bare", w, 0.010, 20.0) for w in (30.0, 30.2, 29.9, 30.1)]
    kit_detail = {"up_to_container_start_s": 0.6, "preflight_s": {0: 2.2, 1: 0.9}, "preflight_settled_s": {0: 0.05}}
    kit = [_run("nodekit", w, 0.013, 26.0, **kit_detail) for w in (36.0, 36.1, 35.9, 36.2)]
    rs = decide.rows(bare, kit, {"`nodekit --help`": [0.2, 0.21, 0.22]}, seed=0)
    by = {r.phase: r for r in rs}
    assert by["whole job"].verdict is not None and by["whole job"].verdict.status == "missed"
    assert by["per step (median interval)"].interval.estimate == pytest.approx(1.3)
    assert by["time to first step"].verdict is not None and by["time to first step"].verdict.status == "met"
    assert by["CPU time, user+system"].verdict is None
    assert by["`nodekit --help`"].verdict == stats.verdict(by["`nodekit --help`"].interval, 0.5)
    whole_preflight = by["preflight on main, whole (torch import and the wait for nodes included)"]
    assert whole_preflight.nodekit == pytest.approx(2.2) and whole_preflight.verdict is None
    own = by["preflight's own cost on main (once every node was there)"]
    assert own.nodekit == pytest.approx(0.05) and own.verdict is not None and own.verdict.status == "met"
    text = decide.table(rs)
    assert "| whole job | 30.050 s | 36.050 s | x1.200 [" in text
    assert "| <= x1.05 | **missed** |" in text
    assert "| per step (median interval) | 10.00 ms | 13.00 ms |" in text


def test_splice_replaces_only_the_decide_block_of_its_key() -> None:
    b30, e30 = decide.DOCS_BEGIN.format(" epochs=30"), decide.DOCS_END.format(" epochs=30")
    b150, e150 = decide.DOCS_BEGIN.format(" epochs=150"), decide.DOCS_END.format(" epochs=150")
    doc = "# Benchmarks\n\nintro\n"
    once = decide.splice(doc, "table 1", key=" epochs=30")
    assert once == f"# Benchmarks\n\nintro\n\n{b30}\ntable 1\n{e30}\n"
    both = decide.splice(once + "after\n", "long 1", key=" epochs=150")
    assert both == f"# Benchmarks\n\nintro\n\n{b30}\ntable 1\n{e30}\nafter\n\n{b150}\nlong 1\n{e150}\n"
    again = decide.splice(both, "table 2\n", key=" epochs=30")
    assert again == both.replace("table 1", "table 2")


def test_cgroup_meter_reads_the_final_value_of_an_emptied_cgroup(tmp_path: Path) -> None:
    cg = tmp_path / "cpuacct" / "docker" / "abc"
    cg.mkdir(parents=True)
    (cg / "cpuacct.usage").write_text("2500000000\n")
    (cg / "cgroup.procs").write_text("")
    meter = decide.CgroupCpu("abc", root=str(tmp_path))
    meter.run()
    assert (meter.cpu_s, meter.exact) == (2.5, True)


def test_cgroup_meter_keeps_the_last_value_when_the_cgroup_vanishes(tmp_path: Path) -> None:
    cg = tmp_path / "system.slice" / "docker-abc.scope"
    cg.mkdir(parents=True)
    (cg / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (cg / "cgroup.procs").write_text("4242\n")
    meter = decide.CgroupCpu("abc", root=str(tmp_path))
    meter.start()
    while meter.cpu_s != meter.cpu_s:  # NaN until the first read
        time.sleep(0.005)
    shutil.rmtree(cg)  # what the runtime does when the container exits
    meter.join(timeout=10)
    assert not meter.is_alive()
    assert (meter.cpu_s, meter.exact) == (1.5, False)


def test_cgroup_meter_without_a_cgroup_reports_nothing(tmp_path: Path) -> None:
    meter = decide.CgroupCpu("absent", root=str(tmp_path))
    meter.run()
    assert meter.where is None
    assert meter.cpu_s != meter.cpu_s


def test_wait_cpu_gives_the_exit_code_and_the_child_cpu_time() -> None:
    busy = "import sys\nx = 0\nfor i in range(3_000_000):\n    x += i\nsys.exit(3)\n"
    code, cpu = decide._wait_cpu(subprocess.Popen([sys.executable, "-c", busy]))
    assert code == 3
    assert cpu > 0
