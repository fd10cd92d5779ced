"""A fleet run asks each ``ssh://`` host for its facts, its engine and the run's image in one SSH command
(remote.check_script, issue 33: before, three round trips per host), and ships only to the hosts that lack the image.

Here the script runs in a real ``sh``, reached through an ``ssh`` that runs what it is given, against a stand-in
``docker`` that answers in Docker's own words (captured from Docker 26.1.5 and 28.5 here: "Error response from daemon:
No such image", "Cannot connect to the Docker daemon"). The real engines, of both image stores, answer the same
script over real SSH in tests/cluster/test_fleet.py."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from nodekit.backends.fleet import image, remote
from nodekit.backends.fleet.hosts import FleetHost, fleet_hosts
from nodekit.errors import EngineError
from nodekit.system import docker
from nodekit.system.host.facts import Gathered, HostFacts

LOCAL = docker.ImageInfo(id="sha256:" + "a" * 64, tags=("nk/demo:1",), labels={}, size=1, identity="sha256:" + "i" * 64)
HOSTS = fleet_hosts(["ssh://root@10.0.0.1", "ssh://root@10.0.0.2", "ssh://root@10.0.0.3"], 3)
INSPECTED = {
    "Id": "sha256:" + "c" * 64,
    "RepoTags": ["nk/demo:1"],
    "Size": 123,
    "Os": "linux",
    "Architecture": "amd64",
    "Config": {"Env": ["PATH=/usr/bin", "A=b=c"], "Labels": {"io.nodekit.fingerprint": "f" * 64}},
    "RootFS": {"Type": "layers", "Layers": ["sha256:" + "1" * 64, "sha256:" + "2" * 64]},
}

SSH = """#!/bin/sh
# A host's login shell, reached as ssh would reach it: the command is the last argument.
for last; do :; done
exec sh -c "$last"
"""
# Docker's CLI as the host has it: $FAKE_DOCKER says which engine answers (ok, gone, hung, down), $FAKE_LOG gets
# each call's arguments.
DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case $FAKE_DOCKER:$1 in
  hung:*) sleep 30 ;;
  down:*) echo; echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon \
running?" >&2; exit 1 ;;
  gone:image) echo; echo "Error response from daemon: No such image: $5" >&2; exit 1 ;;
  *:image) cat "$FAKE_INSPECT" ;;
  *:version) echo 28.5.2 ;;
  *:info) echo '{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}' ;;
esac
"""


@pytest.fixture
def host_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``ssh`` and ``docker`` first on PATH; returns the log of docker calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ssh", SSH), ("docker", DOCKER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "inspect.json").write_text(json.dumps(INSPECTED) + "\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_INSPECT", str(tmp_path / "inspect.json"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "docker.log"))
    monkeypatch.setenv("FAKE_DOCKER", "ok")
    return tmp_path / "docker.log"


def calls(log: Path) -> list[str]:
    return [ln.split()[0] for ln in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize(
    ("there", "has"),
    [
        (LOCAL, True),  # the same id: the same image store, the same image
        (docker.ImageInfo(id="sha256:" + "b" * 64, tags=(), labels={}, size=1, identity=LOCAL.identity), True),
        (docker.ImageInfo(id="sha256:" + "b" * 64, tags=(), labels={}, size=1, identity="sha256:" + "j" * 64), False),
        (docker.ImageInfo(id="sha256:" + "b" * 64, tags=(), labels={}, size=1, identity=""), False),
        (None, False),  # not there, or it could not tell: the ship path surveys it
    ],
)
def test_a_host_has_the_image_when_the_survey_would_skip_it(there: docker.ImageInfo | None, has: bool) -> None:
    assert image.is_this_image(LOCAL, there) is has


def test_one_ssh_command_brings_the_facts_the_engine_and_the_image(host_shell: Path) -> None:
    """The image's own JSON, parsed as the docker CLI's direct inspect is (the same identity), from one docker call:
    its answer proves the engine answers, so no ``docker version`` follows."""
    got = remote.check_host(HOSTS[1], remote.Expect(image="nk/demo:1", paths=("/",)), None)
    assert isinstance(got, remote.HostReport), got
    assert got.image_known and got.image == docker.models.image_info_of(INSPECTED)
    assert got.image.env == {"PATH": "/usr/bin", "A": "b=c"}
    assert got.image.layers == ("sha256:" + "1" * 64, "sha256:" + "2" * 64)
    assert got.gathered.hostname and not got.gathered.absent
    assert calls(host_shell) == ["image"]


def test_an_image_the_host_lacks_is_an_answer_and_the_host_passes(
    host_shell: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DOCKER", "gone")
    got = remote.check_host(HOSTS[1], remote.Expect(image="nk/demo:1"), None)
    assert isinstance(got, remote.HostReport) and got.image is None and got.image_known
    assert calls(host_shell) == ["image"]


def test_an_engine_that_does_not_answer_fails_the_host_in_its_own_words(
    host_shell: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DOCKER", "down")
    got = remote.check_host(HOSTS[2], remote.Expect(image="nk/demo:1"), None)
    assert isinstance(got, list) and len(got) == 1
    assert got[0].line() == (
        "node 2 (root@10.0.0.3): no Docker engine answers at ssh://root@10.0.0.3 (Cannot connect to the Docker daemon "
        f"at unix:///var/run/docker.sock. Is the docker daemon running?). Fix: {docker.ENGINE_FIX}"
    )
    assert calls(host_shell) == ["image", "version"]  # the version call tells a dead engine from an odd answer


def test_a_hung_engine_is_stopped_at_its_deadline_and_named(host_shell: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DOCKER", "hung")
    monkeypatch.setattr(remote, "ENGINE_S", 1.0)
    got = remote.check_host(HOSTS[0], remote.Expect(image="nk/demo:1"), None)
    assert isinstance(got, list) and [p.what for p in got] == ["its Docker engine did not answer within 1 s"]
    assert got[0].fix == docker.hung_fix("ssh://root@10.0.0.1")
    assert calls(host_shell) == ["image"]  # no second call after a hang


def test_a_host_without_the_docker_cli_is_named(
    tmp_path: Path, host_shell: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PATH with the tools the script uses and no docker at all (this machine has one in /usr/bin)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("sh", "sed", "tail", "grep", "cat", "awk", "hostname", "timeout", "ssh"):
        found = shutil.which(tool, path=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
        assert found, tool
        (tools / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(tools))
    got = remote.check_host(HOSTS[1], remote.Expect(image="nk/demo:1"), None)
    assert isinstance(got, list) and [p.what for p in got] == ["the docker command-line client is not installed there"]


@pytest.mark.parametrize(("gpus", "asked"), [(None, []), (2, ["info"]), (0, [])])
def test_runtimes_are_asked_only_where_gpus_are_expected_or_found(
    host_shell: Path, gpus: int | None, asked: list[str]
) -> None:
    """This machine has no GPU: the script finds none, so only the config's count asks for the runtimes."""
    got = remote.check_host(HOSTS[1], remote.Expect(image="nk/demo:1"), gpus)
    if gpus:
        assert isinstance(got, remote.HostReport) and got.gathered.facts.gpu_count == 2  # nvidia is among the runtimes
    else:
        assert isinstance(got, remote.HostReport)
    assert calls(host_shell) == ["image", *asked]


def test_without_an_image_to_ask_the_engine_version_is_the_check(host_shell: Path) -> None:
    got = remote.check_host(HOSTS[1], remote.Expect(), None)
    assert isinstance(got, remote.HostReport) and got.image is None and not got.image_known
    assert calls(host_shell) == ["version"]


def test_the_engine_lines_parse_to_what_the_script_meant() -> None:
    said = remote.parse_engine('gpu=A\nengine=ok\nimage=none\nruntimes={"runc":{},"nvidia":{}}\n')
    assert said == remote.EngineSaid(state="ok", image=None, image_known=True, runtimes=("nvidia", "runc"))
    said = remote.parse_engine("image_error=Error: permission denied\nengine=ok\n")
    assert said.state == "ok" and not said.image_known  # the ship path surveys that host
    assert remote.parse_engine("host=n1\n").state == "error"  # no engine line at all: the script was cut short
    cut = remote.parse_engine('engine=ok\nimage={"Id": "sha256:ab\nruntimes={"ru\n')  # an answer cut short
    assert cut.state == "ok" and not cut.image_known and cut.runtimes is None


def test_check_all_reports_each_host_as_it_ends_and_refuses_every_failed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``on_done`` runs for every host; a failed host makes check_all raise, naming it, with nothing started; this
    machine's Compose plugin is asked once, beside the hosts."""
    order: list[str] = []
    lock = threading.Lock()
    composes: list[None] = []

    def check_host(
        h: FleetHost, expect: object, gpus: object, opened: object = None
    ) -> remote.HostReport | list[remote.Problem]:
        if h.rank == 2:
            return [remote.Problem(h, "SSH to root@10.0.0.3 failed: Connection refused", "check it")]
        return remote.HostReport(gathered=Gathered(facts=HostFacts(gpu_count=h.rank)))

    def note(what: str) -> None:
        with lock:
            order.append(what)

    monkeypatch.setattr(remote, "check_host", check_host)

    def compose_version() -> str:
        composes.append(None)
        return "2.40.3"

    monkeypatch.setattr(docker, "compose_version", compose_version)
    with pytest.raises(remote.FleetCheckError) as refused:
        remote.check_all(
            HOSTS,
            expect=lambda h: remote.Expect(),
            gpus=lambda h: None,
            on_done=lambda h, why: note(f"done {h.rank} {'ok' if why is None else 'failed'}"),
        )
    assert "1 of 3 host(s) failed the checks, nothing was started" in refused.value.message
    assert "node 2 (root@10.0.0.3)" in refused.value.message
    assert sorted(order) == ["done 0 ok", "done 1 ok", "done 2 failed"]

    got = remote.check_all(HOSTS[:2], expect=lambda h: remote.Expect(), gpus=lambda h: None)
    assert [r.gathered.facts.gpu_count for r in got] == [0, 1]  # rank order
    assert len(composes) == 2

    def no_compose() -> str:
        raise EngineError("Docker Compose v2 (the `docker compose` plugin) is missing", fix=docker.ENGINE_FIX)

    monkeypatch.setattr(docker, "compose_version", no_compose)
    with pytest.raises(EngineError, match="Compose v2"):
        remote.check_all(HOSTS[:2], expect=lambda h: remote.Expect(), gpus=lambda h: None)
