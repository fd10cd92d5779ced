"""nodekit push decides per target from data (image ids, engine ids, free disk); no Docker involved."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest

from nodekit import docker, ship
from nodekit.errors import ShipError, UsageError
from nodekit.progress import RecordingReporter
from nodekit.ship import fanout

GiB = 1 << 30
NEW = "sha256:" + "a" * 64
OLD = "sha256:" + "b" * 64
SRC = ship.Source(ref="nodekit/demo:abc123", image_id=NEW, size=2 * GiB, engine_id="engine-src")


def state(name: str, endpoint: str | None = None, **kw: object) -> ship.TargetState:
    t = ship.Target(name=name, endpoint=endpoint or f"ssh://root@{name}")
    kw.setdefault("engine_id", f"engine-{name}")
    kw.setdefault("server_version", "26.1.5")
    return ship.TargetState(target=t, **kw)  # type: ignore[arg-type]


def actions(plan: ship.PushPlan) -> dict[str, str]:
    return {s.target.name: s.action for s in plan.steps}


def test_targets_with_the_same_image_id_are_skipped_others_load() -> None:
    plan = ship.plan_push(
        SRC,
        [
            state("n1", ref_id=NEW, has_image=True),
            state("n2"),
            state("n3", ref_id=OLD),
            state("n4", ref_id=OLD, has_image=True),
        ],
    )
    assert actions(plan) == {"n1": "skip", "n2": "load", "n3": "load", "n4": "tag"}
    by = {s.target.name: s for s in plan.steps}
    assert by["n3"].previous_id == OLD and "older image" in by["n3"].reason
    assert by["n4"].previous_id == OLD
    assert [s.target.name for s in plan.loads()] == ["n2", "n3"]


def test_the_source_engine_itself_is_skipped() -> None:
    plan = ship.plan_push(SRC, [state("self", engine_id="engine-src")])
    assert actions(plan) == {"self": "skip"}
    assert "source engine" in plan.steps[0].reason


def test_unreachable_target_refuses_before_anything_moves() -> None:
    with pytest.raises(ShipError) as e:
        ship.plan_push(SRC, [state("n1"), state("n2", error="no Docker engine answers at ssh://root@n2 (timeout)")])
    assert e.value.node == "n2"
    line = e.value.one_line()
    assert line.startswith("[n2] cannot push to n2: no Docker engine answers at ssh://root@n2")
    assert "docker -H ssh://root@n2 info" in line


def test_several_unreachable_targets_are_all_named() -> None:
    with pytest.raises(ShipError) as e:
        ship.plan_push(SRC, [state("n1", error="x"), state("n2", error="y"), state("n3", error="z")])
    assert "(and 2 more: n2, n3)" in e.value.message


def test_too_little_disk_refuses_naming_the_node() -> None:
    with pytest.raises(ShipError) as e:
        ship.plan_push(SRC, [state("n1", free_bytes=10 * GiB), state("n2", free_bytes=3 * GiB)])
    assert e.value.node == "n2"
    assert "3.0 GiB free" in e.value.message and "docker system prune" in (e.value.fix or "")


def test_disk_does_not_matter_when_nothing_is_loaded() -> None:
    plan = ship.plan_push(SRC, [state("n1", ref_id=NEW, has_image=True, free_bytes=0)])
    assert actions(plan) == {"n1": "skip"}


def test_unknown_free_disk_does_not_block() -> None:
    assert actions(ship.plan_push(SRC, [state("n1", free_bytes=None)])) == {"n1": "load"}


def test_a_target_named_twice_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        ship.plan_push(SRC, [state("a", endpoint="tcp://x:2376"), state("b", endpoint="tcp://x:2376")])


@pytest.mark.parametrize(
    ("endpoint", "compress", "zstd_here", "version", "codec"),
    [
        ("unix:///var/run/docker.sock", "auto", True, "26.1.5", "none"),
        ("ssh://u@h", "auto", True, "26.1.5", "zstd"),
        ("ssh://u@h", "auto", False, "26.1.5", "gzip"),
        ("tcp://h:2376", "auto", True, "20.10.24", "gzip"),
        ("unix:///s", "gzip", True, "26.1.5", "gzip"),
        ("ssh://u@h", "none", True, "26.1.5", "none"),
    ],
)
def test_codec_choice(endpoint: str, compress: ship.Compress, zstd_here: bool, version: str, codec: str) -> None:
    assert ship.choose_codec(compress, endpoint, zstd_here=zstd_here, server_version=version) == codec


def test_plan_text_shows_every_target_and_action() -> None:
    plan = ship.plan_push(SRC, [state("n1", ref_id=NEW, has_image=True), state("n2")], zstd_here=True)
    text = plan.to_text()
    assert "push nodekit/demo:abc123 (aaaaaaaaaaaa, 2.0 GiB)" in text
    assert "n1" in text and "skip: already has aaaaaaaaaaaa" in text
    assert "load (zstd stream): does not have the image" in text


@pytest.mark.parametrize(
    ("spec", "name", "endpoint"),
    [
        ("ssh://root@10.0.0.2", "root@10.0.0.2", "ssh://root@10.0.0.2"),
        ("node1=ssh://root@10.0.0.2", "node1", "ssh://root@10.0.0.2"),
        ("tcp://10.0.0.3:2376", "10.0.0.3:2376", "tcp://10.0.0.3:2376"),
        ("unix:///run/x.sock", "unix:///run/x.sock", "unix:///run/x.sock"),
    ],
)
def test_parse_target(spec: str, name: str, endpoint: str) -> None:
    assert ship.parse_target(spec) == ship.Target(name=name, endpoint=endpoint)


@pytest.mark.parametrize("spec", ["10.0.0.2", "http://x", "node1=10.0.0.2", ""])
def test_parse_target_rejects_non_endpoints(spec: str) -> None:
    with pytest.raises(UsageError):
        ship.parse_target(spec)


@pytest.mark.parametrize(
    ("says", "kind"),
    [
        ("write /var/lib/docker/tmp/docker-import-1/blobs/sha256/x: no space left on device", "disk"),
        ("unexpected EOF", "corrupt"),
        ("archive/tar: invalid tar header", "corrupt"),
        ("open /var/lib/docker/tmp/docker-import-2/manifest.json: no such file or directory", "corrupt"),
        ("permission denied while trying to connect", "other"),
    ],
)
def test_load_failures_are_classified(says: str, kind: str) -> None:
    assert ship.diagnose_load_failure(says) == kind


@pytest.mark.parametrize("codec", ["none", "gzip", "zstd"])
def test_compressed_round_trip(codec: ship.Codec) -> None:
    import shutil
    import subprocess
    import zlib

    if codec == "zstd" and shutil.which("zstd") is None:
        pytest.skip("no zstd command")
    data = [bytes([i]) * 100_000 for i in range(20)]
    out = b"".join(ship.compressed(iter(data), codec))
    if codec == "gzip":
        out = zlib.decompress(out, 31)
    elif codec == "zstd":
        out = subprocess.run(["zstd", "-d", "-c"], input=out, capture_output=True, check=True).stdout
    assert out == b"".join(data)


def test_codec_for_file() -> None:
    from pathlib import Path

    assert ship.codec_for_file(Path("a.tar.zst")) == "zstd"
    assert ship.codec_for_file(Path("a.tgz")) == "gzip"
    assert ship.codec_for_file(Path("a.tar")) == "none"
    with pytest.raises(UsageError):
        ship.codec_for_file(Path("a.img"))


class FakeSink:
    def __init__(self, fail_after: int | None = None) -> None:
        self.chunks: list[bytes] = []
        self.finished = self.aborted = False
        self.fail_after = fail_after

    def write(self, chunk: bytes) -> None:
        if self.fail_after is not None and len(self.chunks) >= self.fail_after:
            raise ShipError("docker load on x failed: write /var/lib/docker/tmp/x: no space left on device")
        self.chunks.append(chunk)

    def finish(self) -> docker.Loaded:
        self.finished = True
        return docker.Loaded(refs=(SRC.ref,), ids=())

    def abort(self) -> None:
        self.aborted = True


def test_fan_out_feeds_every_target_and_drops_a_failing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One source stream reaches every live target; a target that fails is cut off and named, the rest finish."""
    sinks = {"ssh://a": FakeSink(), "ssh://b": FakeSink(fail_after=2), "ssh://c": FakeSink()}
    verified: list[str] = []
    monkeypatch.setattr(fanout, "_verify", lambda src, step: verified.append(step.target.name))
    plan = ship.plan_push(SRC, [state("a", "ssh://a"), state("b", "ssh://b"), state("c", "ssh://c")], compress="none")
    chunks = [bytes([i]) * 1000 for i in range(50)]

    def source(ref: str, endpoint: str | None) -> Iterable[bytes]:
        return iter(chunks)

    rep = RecordingReporter()
    with pytest.raises(ShipError) as e:
        ship.push(plan, rep, open_source=source, open_sink=lambda ep: sinks[ep])
    assert e.value.node == "b" and "ran out of disk space" in e.value.message
    assert sinks["ssh://b"].aborted and not sinks["ssh://b"].finished
    for ep in ("ssh://a", "ssh://c"):
        assert b"".join(sinks[ep].chunks) == b"".join(chunks) and sinks[ep].finished
    assert sorted(verified) == ["a", "c"]


def test_a_broken_source_stream_aborts_every_target() -> None:
    sinks = {"ssh://a": FakeSink(), "ssh://b": FakeSink()}
    plan = ship.plan_push(SRC, [state("a", "ssh://a"), state("b", "ssh://b")], compress="gzip")

    def source(ref: str, endpoint: str | None) -> Iterable[bytes]:
        yield b"x" * 1000
        raise ShipError("docker save nodekit/demo:abc123 on the local Docker engine failed: unexpected EOF")

    with pytest.raises(ShipError) as e:
        ship.push(plan, RecordingReporter(), open_source=source, open_sink=lambda ep: sinks[ep])
    assert "nothing was loaded" in e.value.message and "(and 1 more failed" in e.value.message
    assert all(s.aborted and not s.finished for s in sinks.values())


class StalledSink(FakeSink):
    """A target that stopped reading: write blocks until the sink is aborted (as killing `docker load` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def write(self, chunk: bytes) -> None:
        if self.chunks:
            self.released.wait(30)
            raise ShipError("docker load on s: broken pipe")
        self.chunks.append(chunk)

    def abort(self) -> None:
        self.aborted = True
        self.released.set()


def test_a_target_that_stops_reading_is_cut_off_and_the_others_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, one stalled target stalled every target, forever."""
    sinks = {"ssh://a": FakeSink(), "ssh://s": StalledSink(), "ssh://c": FakeSink()}
    monkeypatch.setattr(fanout, "_verify", lambda src, step: None)
    plan = ship.plan_push(SRC, [state("a", "ssh://a"), state("s", "ssh://s"), state("c", "ssh://c")], compress="none")
    chunks = [bytes([i]) * 1000 for i in range(60)]
    started = time.monotonic()
    with pytest.raises(ShipError) as e:
        ship.push(
            plan, RecordingReporter(), open_source=lambda r, ep: iter(chunks), open_sink=lambda ep: sinks[ep],
            stall_s=0.5,
        )  # fmt: skip
    assert time.monotonic() - started < 10
    assert e.value.node == "s" and "stopped reading the image stream: nothing taken for 0.5 s" in e.value.message
    assert sinks["ssh://s"].aborted
    for ep in ("ssh://a", "ssh://c"):
        assert b"".join(sinks[ep].chunks) == b"".join(chunks) and sinks[ep].finished
