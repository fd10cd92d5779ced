"""What a fleet run tells its record (nodekit/runs/): the backend's few calls and the lines the nodes print, from a
`nodekit run` whose engines are stand-ins (no process starts): every node's phases, the failing node, rank and
signal, and with keep_containers every container stopped and kept instead of removed."""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodekit.backends.fleet import follow, remote, run, start, stop
from nodekit.backends.fleet.hosts import FleetHost, fleet_hosts
from nodekit.config import settings as config
from nodekit.errors import ImageError, JobFailed
from nodekit.image.plan import LABEL_FINGERPRINT
from nodekit.launcher.contract import PREFLIGHT_OK, RENDEZVOUS_DONE
from nodekit.runs import store
from nodekit.runs.recorder import begin
from nodekit.system import docker
from nodekit.system.host import net
from nodekit.system.host.facts import HostFacts
from nodekit.system.progress import RecordingReporter

IMAGE = "nodekit/evdemo:0123456789ab"


class Engines:
    """Three nodes' engines: each node prints its launcher's lines, node 2 then dies with SIGKILL (137); the others
    run until stopped (143)."""

    def __init__(self) -> None:
        self.stopped = {r: threading.Event() for r in range(3)}
        self.ended: list[tuple[str, int]] = []
        self.output: dict[int, list[str]] = {}  # what each node's job prints after its first step

    @staticmethod
    def rank(project: str) -> int:
        return int(project.rsplit("node", 1)[1])

    def up(self, path: Path, project: str, *, host: str | None = None) -> None:
        pass

    def logs(self, path: Path | None, project: str, *, follow: bool, tail: str | None = None,
             host: str | None = None) -> Iterator[str]:  # fmt: skip
        r = self.rank(project)
        yield from (f"nodekit evdemo: node {r}/3", f"{PREFLIGHT_OK}, 3/3 nodes", RENDEZVOUS_DONE, f"step 1 on {r}")
        yield from self.output.get(r, ())
        self.stopped[r].wait(30) if r != 2 else None

    def wait(self, path: Path | None, project: str, *, service: str | None = None, host: str | None = None) -> int:
        r = self.rank(project)
        if r == 2:
            return 137
        self.stopped[r].wait(30)
        return 143

    def follow(self, host: FleetHost, path: Path, project: str, service: str, on_line: Callable[[str], object]) -> int:
        """nodekit/backends/fleet/follow.py's one stream per node: the log, then the exit code."""
        for line in self.logs(path, project, follow=True):
            on_line(line)
        return self.wait(path, project, service=service)

    def end(self, verb: str) -> object:
        def stop(path: Path | None, project: str, *, timeout: int | None = None, host: str | None = None) -> None:
            self.ended.append((verb, self.rank(project)))
            self.stopped[self.rank(project)].set()

        return stop


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Engines:
    e = Engines()
    info = docker.ImageInfo(
        id="sha256:" + "e" * 64,
        tags=(IMAGE,),
        labels={LABEL_FINGERPRINT: "0123456789ab" + "0" * 52},
        size=1,
        identity="sha256:" + "e" * 64,
    )
    monkeypatch.setattr(docker, "require_image", lambda *a, **k: info)
    passed = remote.HostReport(gathered=remote.Gathered(facts=HostFacts()))
    monkeypatch.setattr(remote, "check_all", lambda hosts, **k: [passed for _ in hosts])
    monkeypatch.setattr(run, "ship_image", lambda *a, **k: None)
    monkeypatch.setattr(net, "resolve", lambda name: "10.0.0.1")
    monkeypatch.setattr(remote, "opening", lambda hosts: contextlib.nullcontext({}))  # no host to connect to
    monkeypatch.setattr(docker, "compose_up", e.up)
    monkeypatch.setattr(start, "start", lambda host, plan, **_: e.up(plan.compose_path, plan.project, host=host.url))
    monkeypatch.setattr(follow, "follow", e.follow)
    monkeypatch.setattr(docker, "compose_down", e.end("down"))
    monkeypatch.setattr(docker, "compose_stop", e.end("stop"))
    ends = {False: e.end("down"), True: e.end("stop")}
    monkeypatch.setattr(stop, "stop", lambda host, project, *, timeout, keep=False: ends[keep](None, project))
    for var in ("NODEKIT_CONFIG", "NODEKIT_NNODES", "NODEKIT_NAME", "NODEKIT_KEEP_CONTAINERS"):
        monkeypatch.delenv(var, raising=False)
    return e


@pytest.mark.parametrize("keep", [False, True])
def test_a_fleet_run_tells_its_record_each_phase_and_the_failure(engines: Engines, tmp_path: Path, keep: bool) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "nodekit.toml").write_text(
        f'name = "evdemo"\nscript = "train.py"\nhosts = ["ssh://root@10.0.0.1", "ssh://root@10.0.0.2", '
        f'"ssh://root@10.0.0.3"]\nkeep_containers = {"true" if keep else "false"}\n'
    )
    settings = config.load(tmp_path / "nodekit.toml")
    hosts = fleet_hosts(settings.hosts, 3)
    rec = begin(settings, "run", [(h.rank, h.where) for h in hosts], environ={})
    ticks = itertools.count()
    with pytest.raises(JobFailed) as failed:
        run.run(settings, hosts, _Quiet(), rec.tee(lambda r, t: None), image=IMAGE, events=rec,
                clock=lambda: next(ticks) * 0.5)  # fmt: skip
    rec.finish(failed.value.exit_code, reason=failed.value.message)
    r = store.load(rec.dir)
    assert (r.exit_code, r.failed_rank, r.failed_host, r.signal) == (137, 2, "root@10.0.0.3", "SIGKILL")
    assert r.image == IMAGE and r.fingerprint.startswith("0123456789ab") and r.image_id.startswith("sha256:e")
    for n in r.nodes:
        assert list(n.phases) == ["image", "started", "preflight", "rendezvous", "output", "end"], n
    assert [n.exit_code for n in r.nodes] == [143, 143, 137]
    assert r.log_tail == ["nodekit evdemo: node 2/3", f"{PREFLIGHT_OK}, 3/3 nodes", RENDEZVOUS_DONE, "step 1 on 2"]
    assert {v for v, _ in engines.ended} == ({"stop"} if keep else {"down"}), "kept only with keep_containers"
    assert {rank for _, rank in engines.ended} == {0, 1, 2}


def _traceback(rank: int, *frames_then_error: str) -> list[str]:
    return [f"[rank{rank}]: {line}" for line in ("Traceback (most recent call last):", *frames_then_error)]


def test_the_closing_line_quotes_the_failing_ranks_exception(engines: Engines, tmp_path: Path) -> None:
    """Node 2's rank raises; the other ranks' gloo calls then fail too, each with a traceback of its own, and the
    cause is far up the merged log: the run's last line quotes node 2's exception beside the node and rank."""
    settings, hosts = _three_hosts(tmp_path)
    gloo = ('  File "/app/train.py", line 61, in <module>', "    dist.all_reduce(t)",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")  # fmt: skip
    engines.output = {
        0: _traceback(0, *gloo) + _traceback(1, *gloo),
        1: _traceback(2, *gloo),
        2: [
            "epoch 3 loss 0.12",
            *_traceback(5, '  File "/app/train.py", line 12, in load', "    raise KeyError(name)", "KeyError: 'x'"),
            "[rank5]: ",
            "[rank5]: During handling of the above exception, another exception occurred:",
            "[rank5]: ",
            *_traceback(5, '  File "/app/train.py", line 40, in <module>', "    check(batch)",
                        "ValueError: batch 7 has NaN in 'loss' (step 1200)"),
            "[rank4]: Traceback (most recent call last):",
            '[rank4]:   File "/app/train.py", line 61',
            *gloo[-1:],
        ],
    }  # fmt: skip
    with pytest.raises(JobFailed) as failed:
        run.run(settings, hosts, _Quiet(), lambda r, t: None, image=IMAGE)
    line = failed.value.message
    assert "failed with exit code 137: rank 5 raised ValueError: batch 7 has NaN in 'loss' (step 1200)" in line, line
    assert "Connection closed by peer" not in line


class _Quiet:
    def step(self, message: str) -> None: ...
    def detail(self, line: str) -> None: ...
    def done(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def fail(self) -> None: ...


def _three_hosts(tmp_path: Path) -> tuple[config.Settings, list[FleetHost]]:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "nodekit.toml").write_text(
        'name = "evdemo"\nscript = "train.py"\nhosts = ["ssh://root@10.0.0.1", "ssh://root@10.0.0.2", '
        '"ssh://root@10.0.0.3"]\n'
    )
    settings = config.load(tmp_path / "nodekit.toml")
    return settings, fleet_hosts(settings.hosts, 3)


def test_this_machines_image_is_read_while_the_hosts_are_checked(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local read waits for the checks to have begun: read first, as before, it would never see them begin, and
    its 5 s would run out. The run then goes on with the image it read (its id reaches the record)."""
    settings, hosts = _three_hosts(tmp_path)
    checking = threading.Event()
    read = engines_image = docker.ImageInfo(id="sha256:" + "e" * 64, tags=(IMAGE,), labels={}, size=1,
                                            identity="sha256:" + "f" * 64)  # fmt: skip

    def require_image(ref: str, host: str | None = None, *, node: str | None = None) -> docker.ImageInfo:
        assert checking.wait(5), "the hosts were not checked while this machine's image was read"
        return read

    def check_all(hosts: list[FleetHost], **_: object) -> list[remote.HostReport]:
        checking.set()
        return [remote.HostReport(gathered=remote.Gathered(facts=HostFacts()), image=engines_image) for _ in hosts]

    monkeypatch.setattr(docker, "require_image", require_image)
    monkeypatch.setattr(remote, "check_all", check_all)
    rec = begin(settings, "run", [(h.rank, h.where) for h in hosts], environ={})
    with pytest.raises(JobFailed):  # node 2 dies with SIGKILL (the Engines)
        run.run(settings, hosts, _Quiet(), rec.tee(lambda r, t: None), image=IMAGE, events=rec)
    rec.finish(137)
    assert store.load(rec.dir).image_id == "sha256:" + "f" * 64


def test_a_missing_local_image_is_named_before_any_hosts_failure(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when the image was read before the checks: this machine's to fix first, and nothing started."""
    settings, hosts = _three_hosts(tmp_path)

    def require_image(ref: str, host: str | None = None, *, node: str | None = None) -> docker.ImageInfo:
        raise ImageError(f"image {ref} is not on the local Docker engine", fix="nodekit build")

    def check_all(hosts: list[FleetHost], **_: object) -> list[remote.HostReport]:
        raise remote.FleetCheckError("1 of 3 host(s) failed the checks, nothing was started: ...", fix="fix it")

    monkeypatch.setattr(docker, "require_image", require_image)
    monkeypatch.setattr(remote, "check_all", check_all)
    with pytest.raises(ImageError, match="is not on the local Docker engine"):
        run.run(settings, hosts, _Quiet(), lambda r, t: None, image=IMAGE)
    assert not (tmp_path / "compose").exists()


def test_a_run_whose_hosts_fail_their_checks_still_records_its_image(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image is read beside the checks; the record has it even when a host's check ends the run."""
    settings, hosts = _three_hosts(tmp_path)

    def check_all(hosts: list[FleetHost], **_: object) -> list[remote.HostReport]:
        raise remote.FleetCheckError("1 of 3 host(s) failed the checks, nothing was started: ...", fix="fix it")

    monkeypatch.setattr(remote, "check_all", check_all)
    rec = begin(settings, "run", [(h.rank, h.where) for h in hosts], environ={})
    with pytest.raises(remote.FleetCheckError):
        run.run(settings, hosts, _Quiet(), rec.tee(lambda r, t: None), image=IMAGE, events=rec)
    rec.finish(2)
    r = store.load(rec.dir)
    assert r.image == IMAGE and r.image_id == "sha256:" + "e" * 64


def test_a_main_that_is_none_of_host_0s_addresses_is_refused_before_the_image_is_shipped(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong main costs the host checks (seconds), not a push of the image (minutes) to hosts that lack it."""
    from nodekit.errors import UsageError

    settings, hosts = _three_hosts(tmp_path)
    settings = settings.model_copy(update={"main": "192.0.2.77"})
    shipped: list[object] = []
    here = remote.HostReport(gathered=remote.Gathered(facts=HostFacts(), addresses=frozenset({"10.0.0.1"})))
    monkeypatch.setattr(remote, "check_all", lambda hosts, **k: [here for _ in hosts])  # no host has the image
    monkeypatch.setattr(run, "ship_image", lambda *a, **k: shipped.append(a))
    monkeypatch.setattr(net, "resolve", lambda name: name)
    with pytest.raises(UsageError, match=r"main = '192.0.2.77' \(192.0.2.77\) is none of .*addresses \(10.0.0.1\)"):
        run.run(settings, hosts, _Quiet(), lambda r, t: None, image=IMAGE)
    assert shipped == [] and not (tmp_path / "compose").exists()


def test_a_culprit_that_exited_19_is_quoted_by_the_verdict_its_watchdog_printed_not_its_gloo_error(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 2 exits 19: its watchdog named node 1, lost (its host gone before the head heard of it). The closing line
    quotes that verdict, not node 2's own gloo traceback, the consequence."""
    from nodekit.launcher.watchdog.decide import Lost, lost_line

    settings, hosts = _three_hosts(tmp_path)
    gloo = ('  File "/app/train.py", line 61, in <module>', "    dist.all_reduce(t)",
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")  # fmt: skip
    verdict = lost_line((Lost(rank=1, silent_s=15.0),), {1: "10.0.0.2, host b"}, "this node exits 19")
    engines.output = {2: [*_traceback(2, *gloo), verdict]}
    wait = engines.wait
    monkeypatch.setattr(
        engines, "wait", lambda path, project, **k: 19 if engines.rank(project) == 2 else wait(path, project, **k)
    )
    with pytest.raises(JobFailed) as failed:
        run.run(settings, hosts, _Quiet(), lambda r, t: None, image=IMAGE)
    line = failed.value.message
    assert "failed with exit code 19: node 1 (10.0.0.2, host b) lost: no heartbeat for 15 s" in line, line
    assert "Connection closed by peer" not in line


def test_the_progress_lines_count_from_the_commands_start(engines: Engines, tmp_path: Path) -> None:
    """ "N node(s) started (X s since the command)": from the process's start, which the CLI passes, not from the
    hosts' check (before which every host's connection opened: 28 s at 512 stand-in hosts)."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "nodekit.toml").write_text(
        'name = "evdemo"\nscript = "train.py"\nhosts = ["ssh://root@10.0.0.1", "ssh://root@10.0.0.2", '
        '"ssh://root@10.0.0.3"]\n'
    )
    settings = config.load(tmp_path / "nodekit.toml")
    said = RecordingReporter()
    ticks = itertools.count()
    with pytest.raises(JobFailed):
        run.run(settings, fleet_hosts(settings.hosts, 3), said, lambda r, t: None, image=IMAGE,
                clock=lambda: 1000 + next(ticks) * 0.5, started=900.0)  # fmt: skip
    done = " ".join(said.said("done"))
    ready = re.search(r"3 host\(s\) ready \(([\d.]+) s\)", done)
    up = re.search(r"3 node\(s\) started \(([\d.]+) s since the command\)", done)
    assert ready and up, done
    assert 100 <= float(ready.group(1)) <= float(up.group(1)) < 150, done  # not from the check: that is 0 to 50
