"""A fleet run asks each host for the image right after that host's check (nodekit/backends/fleet/image.py, the
``then`` of remote.check_all), and ships only to the hosts that lack it. The engines are stand-ins here: what the
docker CLI answers over ssh:// is covered by tests/cluster/test_fleet.py."""

from __future__ import annotations

import threading

import pytest

from nodekit.backends.fleet import image, remote
from nodekit.backends.fleet.hosts import FleetHost, fleet_hosts
from nodekit.errors import EngineError
from nodekit.system import docker
from nodekit.system.host.facts import Gathered, HostFacts

LOCAL = docker.ImageInfo(id="sha256:" + "a" * 64, tags=("nk/demo:1",), labels={}, size=1, identity="sha256:" + "i" * 64)
HOSTS = fleet_hosts(["ssh://root@10.0.0.1", "ssh://root@10.0.0.2", "ssh://root@10.0.0.3"], 3)


@pytest.mark.parametrize(
    ("there", "has"),
    [
        (LOCAL, True),  # the same id: the same image store, the same image
        (docker.ImageInfo(id="sha256:" + "b" * 64, tags=(), labels={}, size=1, identity=LOCAL.identity), True),
        (docker.ImageInfo(id="sha256:" + "b" * 64, tags=(), labels={}, size=1, identity="sha256:" + "j" * 64), False),
        (docker.ImageInfo(id="sha256:" + "b" * 64, tags=(), labels={}, size=1, identity=""), False),
        (None, False),  # not there: shipped
    ],
)
def test_a_host_has_the_image_when_the_survey_would_skip_it(
    monkeypatch: pytest.MonkeyPatch, there: docker.ImageInfo | None, has: bool
) -> None:
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: asked.append((ref, host)) or there)
    assert image.image_there("nk/demo:1", LOCAL, HOSTS[1]) is has
    assert asked == [("nk/demo:1", "ssh://root@10.0.0.2")]


def test_a_host_that_cannot_say_is_left_to_the_ship_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(ref: str, host: str | None = None) -> None:
        raise EngineError("cannot inspect image nk/demo:1 on ssh://root@10.0.0.2: connection reset")

    monkeypatch.setattr(docker, "image_info", fails)
    assert image.image_there("nk/demo:1", LOCAL, HOSTS[1]) is False


def test_check_all_asks_the_next_question_of_each_passed_host_and_still_refuses_every_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``then`` runs in the host's own thread once it passed and said so (on_done), never for a failed host; a
    failed host still makes check_all raise, naming it, with nothing started."""
    order: list[str] = []
    lock = threading.Lock()

    def check_host(h: FleetHost, expect: object, gpus: object) -> Gathered | list[remote.Problem]:
        if h.rank == 2:
            return [remote.Problem(h, "SSH to root@10.0.0.3 failed: Connection refused", "check it")]
        return Gathered(facts=HostFacts())

    def note(what: str) -> None:
        with lock:
            order.append(what)

    monkeypatch.setattr(remote, "check_host", check_host)
    with pytest.raises(remote.FleetCheckError) as refused:
        remote.check_all(
            HOSTS,
            expect=lambda h: remote.Expect(),
            gpus=lambda h: None,
            on_done=lambda h, why: note(f"done {h.rank} {'ok' if why is None else 'failed'}"),
            then=lambda h: note(f"then {h.rank}"),
        )
    assert "1 of 3 host(s) failed the checks, nothing was started" in refused.value.message
    assert "node 2 (root@10.0.0.3)" in refused.value.message
    assert sorted(order) == ["done 0 ok", "done 1 ok", "done 2 failed", "then 0", "then 1"]
    for rank in (0, 1):
        assert order.index(f"done {rank} ok") < order.index(f"then {rank}")

    monkeypatch.setattr(remote, "check_host", lambda h, e, g: Gathered(facts=HostFacts(gpu_count=h.rank)))
    got = remote.check_all(HOSTS, expect=lambda h: remote.Expect(), gpus=lambda h: None)
    assert [g.facts.gpu_count for g in got] == [0, 1, 2]  # rank order
