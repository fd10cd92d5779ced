"""A run's record as it happens: phases from the backend's calls and from the lines the nodes print, the end
however it comes (a return, a failed job, a signal), the merged log, the files' modes, pruning."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from nodekit.errors import JobFailed
from nodekit.runs import store
from nodekit.runs.recorder import begin, recording
from nodekit.system.proc import Interrupted
from tests.factories import HOSTS, play_three_nodes, project_settings
from tests.factories import RunClock as Clock


def test_a_failed_run_is_recorded_with_its_phases_failure_and_merged_log(tmp_path: Path, clean_env: None) -> None:
    clock = Clock()
    settings = project_settings(tmp_path)
    rec = begin(settings, "run", HOSTS, environ={}, clock=clock)
    assert (rec.dir / store.RECORD).is_file(), "the record exists from the start (nodekit runs shows it running)"
    play_three_nodes(rec, clock, kill=2)
    rec.failed(2, 137, "node 2 failed with exit code 137")
    rec.finish(137)

    r = store.load(rec.dir)
    assert (r.command, r.exit_code, r.failed_rank, r.signal) == ("run", 137, 2, "SIGKILL")
    assert r.failed_host == "root@10.0.0.3" and r.reason == "node 2 failed with exit code 137"
    assert r.fingerprint == "f" * 64 and r.lock_digest == "1" * 64 and r.image_id.startswith("sha256:a")
    for node in r.nodes:
        assert list(node.phases) == ["image", "started", "preflight", "rendezvous", "output", "end"], node
        times = list(node.phases.values())
        assert times == sorted(times) and times[0] > r.started
        assert node.phases["output"] > node.phases["rendezvous"], "c10d's warning before it is not the job's"
    assert [n.exit_code for n in r.nodes] == [143, 143, 137]
    assert r.log_tail[-1] == "step 29 on rank 2" and len(r.log_tail) == 20
    log = (rec.dir / store.LOG).read_text().splitlines()
    assert log[0] == "[node 0] nodekit recdemo: node 0/3 | 1 proc/node" and log[-1] == "[node 2] step 29 on rank 2"
    assert len(log) == 12 + 90
    assert r.ended == clock.now and r.duration(0) == pytest.approx(clock.now - r.started)
    # The user's alone: the merged log is what the job printed.
    assert stat.S_IMODE(rec.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(rec.dir.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((rec.dir / store.RECORD).stat().st_mode) == 0o600


def test_the_settings_and_their_digest_are_recorded_and_the_digest_follows_the_settings(
    tmp_path: Path, clean_env: None
) -> None:
    a = begin(project_settings(tmp_path), "run", HOSTS, environ={}).record
    b = begin(project_settings(tmp_path), "run", HOSTS, environ={}).record
    c = begin(project_settings(tmp_path, "master_port = 29600\n"), "run", HOSTS, environ={}).record
    assert a.settings["nnodes"] == 3 and "project_dir" not in a.settings
    assert a.settings_digest == b.settings_digest != c.settings_digest
    assert a.id != b.id


@pytest.mark.parametrize(
    ("raised", "code", "signal", "state"),
    [
        (JobFailed("node 1 failed", exit_code=3, fix="x"), 3, "", "failed"),
        (Interrupted(15), 143, "SIGTERM", "interrupted"),
        (KeyboardInterrupt(), 130, "SIGINT", "interrupted"),
    ],
)
def test_however_the_command_ends_the_record_is_closed_and_the_error_goes_on(
    tmp_path: Path, clean_env: None, raised: BaseException, code: int, signal: str, state: str
) -> None:
    warned: list[str] = []
    with pytest.raises(type(raised)), recording(project_settings(tmp_path), "run", HOSTS, warn=warned.append) as rec:
        rec.phase(0, "started")
        raise raised
    r = store.load(rec.dir)
    assert (r.exit_code, r.signal, r.state(store.alive)) == (code, signal, state), r
    assert r.ended is not None and warned == []


def test_a_returned_run_without_finish_is_closed_as_ok_and_a_detached_one_stays_open(
    tmp_path: Path, clean_env: None
) -> None:
    with recording(project_settings(tmp_path), "up", [(0, "here")], warn=print) as rec:
        pass
    assert store.load(rec.dir).state(store.alive) == "ok"
    with recording(project_settings(tmp_path), "up", [(0, "here")], warn=print) as rec:
        rec.phase(0, "started")
        rec.detach()
    r = store.load(rec.dir)
    assert r.state(store.alive) == "detached" and r.ended is None


def test_a_by_hand_job_on_one_host_is_one_run_not_a_forever_detached_one_beside_it(
    tmp_path: Path, clean_env: None
) -> None:
    """Issue 46: `nodekit up -r 1 -d`, then `nodekit up -r 0` of the same job on one machine, was listed as two runs,
    the detached one forever "detached". The attached node records the job in the detached node's record; a node
    of another job (other settings), of the same rank, or started too long before is not joined."""
    settings = project_settings(tmp_path)
    clock = Clock()
    with recording(settings, "up", [(1, "here")], warn=print, clock=clock) as worker:
        worker.detach()
    clock.tick(5)
    with recording(settings, "up", [(0, "here")], warn=print, clock=clock) as main:
        main.finish(0)
    assert main.dir == worker.dir
    runs = list(store.records(store.runs_dir(tmp_path)))
    assert len(runs) == 1
    (_, r) = runs[0]
    assert [n.rank for n in r.nodes] == [0, 1] and r.state(store.alive) == "ok" and r.exit_code == 0
    clock.tick(1)
    with recording(settings, "up", [(1, "here")], warn=print, clock=clock) as lone:
        lone.detach()
    clock.tick(settings.rdzv_timeout + 1)  # too late to be the same job
    with recording(settings, "up", [(0, "here")], warn=print, clock=clock) as late:
        late.finish(0)
    assert late.dir != lone.dir and store.load(lone.dir).state(store.alive) == "detached"


def test_one_node_that_fails_is_the_failing_node(tmp_path: Path, clean_env: None) -> None:
    rec = begin(project_settings(tmp_path), "up", [(1, "gpu7")], environ={})
    rec.line(1, "Traceback (most recent call last):")
    rec.exited(1, 1)
    rec.finish(1)
    r = store.load(rec.dir)
    assert (r.failed_rank, r.failed_host, r.log_tail) == (1, "gpu7", ["Traceback (most recent call last):"])


def test_a_restart_keeps_the_earlier_phases_and_sets_aside_a_dropped_host(tmp_path: Path, clean_env: None) -> None:
    clock = Clock()
    rec = begin(project_settings(tmp_path), "run", HOSTS, environ={}, clock=clock)
    play_three_nodes(rec, clock)
    rec.attempt(1, [(0, "root@10.0.0.1"), (1, "root@10.0.0.3")])  # host 2 was lost; 10.0.0.3 is rank 1 now
    clock.tick(5)
    rec.phase(1, "started")
    rec.finish(0)
    r = store.load(rec.dir)
    assert r.attempts == 2 and [n.host for n in r.nodes] == ["root@10.0.0.1", "root@10.0.0.3"]
    assert [n.host for n in r.dropped] == ["root@10.0.0.2"]
    assert list(r.nodes[1].phases) == ["started"] and len(r.nodes[1].earlier) == 1
    assert r.nodes[1].earlier[0]["end"] < r.nodes[1].phases["started"]


def test_old_records_are_pruned_to_runs_keep_but_never_a_running_one(tmp_path: Path, clean_env: None) -> None:
    clock = Clock()
    settings = project_settings(tmp_path, "runs_keep = 3\n")
    made = []
    for i in range(5):
        clock.tick(10)
        rec = begin(settings, "run", HOSTS, environ={}, clock=clock)
        if i != 1:
            rec.finish(0)  # the second stays "running": this process is alive
        made.append(rec.dir.name)
    left = sorted(p.name for p in store.runs_dir(tmp_path).iterdir())
    assert left == sorted([made[1], *made[2:]]), left
    assert [r.id for _, r in store.records(store.runs_dir(tmp_path))] == sorted(left, reverse=True)


def test_a_record_that_cannot_be_written_never_stops_the_run(tmp_path: Path, clean_env: None) -> None:
    settings = project_settings(tmp_path)
    (tmp_path / ".nodekit").mkdir()
    (tmp_path / ".nodekit" / "runs").write_text("a file where the directory goes")
    warned: list[str] = []
    with recording(settings, "run", HOSTS, warn=warned.append) as rec:
        rec.phase(0, "started")
        rec.line(0, "hello")
        rec.finish(0)
    assert len(warned) == 2 and "the run goes on unrecorded" in warned[0] and "incomplete" in warned[1], warned


def test_lookup_by_prefix_and_last(tmp_path: Path, clean_env: None) -> None:
    settings = project_settings(tmp_path)
    clock = Clock()
    ids = []
    for _ in range(2):
        clock.tick(3600)
        rec = begin(settings, "run", HOSTS, environ={}, clock=clock)
        rec.finish(0)
        ids.append(rec.dir.name)
    root = store.runs_dir(tmp_path)
    assert store.find(root, "last").name == ids[1]
    assert store.find(root, ids[0][:15]).name == ids[0]
    with pytest.raises(Exception, match="2 runs with id"):
        store.find(root, ids[0][:8])
    with pytest.raises(Exception, match="no run with id"):
        store.find(root, "1999")


def test_samples_are_appended_and_a_torn_line_is_passed_over(tmp_path: Path) -> None:
    store.append_samples(tmp_path, [{"t": 1, "rank": 0, "cpu_pct": 50.0}])
    store.append_samples(tmp_path, [{"t": 2, "rank": 0, "cpu_pct": 60.0}, {"t": 2, "rank": 1}])
    with open(tmp_path / store.SAMPLES, "a") as f:
        f.write('{"t": 3, "ra')
    assert [s["t"] for s in store.read_samples(tmp_path)] == [1, 2, 2]
    assert oct(os.stat(tmp_path / store.SAMPLES).st_mode & 0o777) == "0o600"
    assert json.loads((tmp_path / store.SAMPLES).read_text().splitlines()[0]) == {"t": 1, "rank": 0, "cpu_pct": 50.0}
