"""nodekit push decides per target from data (image ids, engine ids, free disk); no Docker involved."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable

import pytest

from nodekit import ship
from nodekit.errors import ShipError, UsageError
from nodekit.ship import fanout
from nodekit.system import docker
from nodekit.system.progress import RecordingReporter
from tests.factories import SRC, state

GiB = 1 << 30
NEW = "sha256:" + "a" * 64
OLD = "sha256:" + "b" * 64


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
    plan = ship.plan_push(SRC, [state("self", engine_id="engine-src", ref_id=NEW, has_image=True)])
    assert actions(plan) == {"self": "skip"}
    assert "source engine" in plan.steps[0].reason


def test_an_engine_id_shared_with_the_source_is_not_the_source_engine() -> None:
    """A target whose engine reports the source's ID is not skipped as "the source engine itself", image or not:
    two engines share an ID when a data root was cloned or /etc/docker/key.json existed as both were made."""
    plan = ship.plan_push(SRC, [state("clone", engine_id="engine-src"),
                                state("clone-old", engine_id="engine-src", ref_id=OLD, has_image=False)])  # fmt: skip
    assert actions(plan) == {"clone": "load", "clone-old": "load"}
    assert plan.steps[0].reason == (
        "does not have the image (its engine ID is the source's, engine-src: a cloned data root, or "
        "/etc/docker/key.json, which Docker >= 23 copies into every new data root)"
    )
    # A shared ID with another image store is another engine too: loaded, not skipped.
    other = ship.plan_push(SRC, [state("clone", engine_id="engine-src", containerd_store=True)])
    assert actions(other) == {"clone": "load"}


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


def test_an_image_nodekit_did_not_write_crosses_image_stores_recognized_by_its_identity() -> None:
    """The containerd store names an image by its manifest digest, the classic store by its config digest. For an
    image nodekit did not write, the id the other store will give it is unknown: it is loaded there and verified by
    its identity (layers and configuration, which both stores report alike)."""
    src = dataclasses.replace(SRC, identity="sha256:" + "i" * 64)
    plan = ship.plan_push(src, [state("n1"), state("n2", containerd_store=True)])
    by = {s.target.name: s for s in plan.steps}
    assert actions(plan) == {"n1": "load", "n2": "load"}
    assert (by["n1"].image_id, by["n2"].image_id) == (NEW, "")
    same = ship.plan_push(src, [state("n3", containerd_store=True, ref_id="sha256:" + "x" * 64,
                                      ref_identity="sha256:" + "i" * 64)])  # fmt: skip
    assert actions(same) == {"n3": "skip"}


def test_an_image_nodekit_wrote_crosses_image_stores_with_the_id_each_store_gives_it() -> None:
    """nodekit wrote the config and the manifest: it knows both ids. A mixed fleet (head classic, nodes on the
    containerd store, the state of a cluster upgraded machine by machine) is loaded, each target expecting its id."""
    src = dataclasses.replace(SRC, ids=(NEW, "sha256:" + "m" * 64), identity="sha256:" + "i" * 64)
    plan = ship.plan_push(src, [state("n1"), state("n2", containerd_store=True),
                                state("n3", containerd_store=True, ref_id="sha256:" + "m" * 64)])  # fmt: skip
    by = {s.target.name: s for s in plan.steps}
    assert actions(plan) == {"n1": "load", "n2": "load", "n3": "skip"}
    assert (by["n1"].image_id, by["n2"].image_id) == (NEW, "sha256:" + "m" * 64)
    assert "other image store" in by["n2"].reason
    # Another id at the reference but the same identity (layers and configuration): the same image, skipped.
    same = ship.plan_push(src, [state("n4", containerd_store=True, ref_id="sha256:" + "x" * 64,
                                      ref_identity="sha256:" + "i" * 64)])  # fmt: skip
    assert actions(same) == {"n4": "skip"}


def test_zstd_is_never_handed_to_an_engine_only_to_a_node_that_decompresses_it() -> None:
    """Docker 26.1.5's dockerd crashed in CI decompressing a zstd load (ship.codecs.ZSTD_LOAD_CRASH): zstd goes only to
    an ssh:// node whose own zstd command decompresses it, and only when this machine compresses it."""
    assert {s.codec for s in ship.plan_push(SRC, [state("n1"), state("n2")]).steps} == {"gzip"}
    zstd_nodes = [state("n1", zstd=True), state("n2", zstd=True), state("n3")]
    assert [s.codec for s in ship.plan_push(SRC, zstd_nodes, here_zstd=True).steps] == ["zstd", "zstd", "gzip"]
    assert {s.codec for s in ship.plan_push(SRC, zstd_nodes, here_zstd=False).steps} == {"gzip"}
    for targets, here, why in (
        ([state("n1", zstd=True)], False, "this machine has no zstd command"),
        ([state("n1")], True, "n1 has no zstd command to decompress it"),
        ([state("t", endpoint="tcp://t:2376", zstd=True)], True, "t is not an ssh:// node: its engine would have"),
    ):
        with pytest.raises(UsageError) as e:
            ship.plan_push(SRC, targets, compress="zstd", here_zstd=here)
        assert e.value.one_line().startswith(f"--compress zstd is refused: {why}")
        assert "--compress gzip" in (e.value.fix or "")
    assert {s.codec for s in ship.plan_push(SRC, zstd_nodes[:2], compress="zstd", here_zstd=True).steps} == {"zstd"}


def test_a_target_named_twice_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        ship.plan_push(SRC, [state("a", endpoint="tcp://x:2376"), state("b", endpoint="tcp://x:2376")])


@pytest.mark.parametrize(
    ("endpoint", "compress", "codec"),
    [
        ("unix:///var/run/docker.sock", "auto", "none"),
        ("ssh://u@h", "auto", "gzip"),  # zstd only where both ends have the command (see below)
        ("tcp://h:2376", "auto", "gzip"),
        ("unix:///s", "gzip", "gzip"),
        ("ssh://u@h", "none", "none"),
    ],
)
def test_codec_choice(endpoint: str, compress: ship.Compress, codec: str) -> None:
    assert ship.choose_codec(compress, endpoint) == codec


def test_plan_text_shows_every_target_and_action() -> None:
    plan = ship.plan_push(SRC, [state("n1", ref_id=NEW, has_image=True), state("n2")])
    text = plan.to_text()
    assert "push nodekit/demo:abc123 (aaaaaaaaaaaa, 2.0 GiB)" in text
    assert "n1" in text and "skip: already has aaaaaaaaaaaa" in text
    assert "load (gzip stream): does not have the image" in text


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
        ("open /var/lib/docker/tmp/docker-import-3/blobs/sha256/ab12: no such file or directory", "missing layer"),
        (
            'error during connect: Post "http://docker.example.com/v1.50/images/load": write |1: file already closed',
            "unreachable",
        ),
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
    """One stalled target must not stall every target, forever."""
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


class SilentSink(FakeSink):
    """A target that takes every byte and never answers: finish blocks until the sink is aborted (as killing
    `docker load` does), then fails as a killed load does."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def finish(self) -> docker.Loaded:
        self.released.wait(30)
        raise ShipError("docker load on s failed: signal: killed")

    def abort(self) -> None:
        self.aborted = True
        self.released.set()


def test_a_target_that_takes_every_byte_and_never_answers_is_cut_off_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push does not wait for that target's answer forever."""
    from nodekit.ship import outcome

    sinks = {"ssh://a": FakeSink(), "ssh://s": SilentSink()}
    monkeypatch.setattr(fanout, "_verify", lambda src, step: None)
    monkeypatch.setattr(outcome, "ANSWER_S", 0.5)
    small = dataclasses.replace(SRC, size=60_000)
    plan = ship.plan_push(small, [state("a", "ssh://a"), state("s", "ssh://s")], compress="none")
    chunks = [bytes([i]) * 1000 for i in range(60)]
    started = time.monotonic()
    with pytest.raises(ShipError) as e:
        ship.push(plan, RecordingReporter(), open_source=lambda r, ep: iter(chunks), open_sink=lambda ep: sinks[ep])
    assert time.monotonic() - started < 10
    assert e.value.node == "s" and e.value.message.startswith(
        "s took the whole image stream but did not answer within 1 s of its end; cut off"
    ), e.value.message
    assert sinks["ssh://s"].aborted and b"".join(sinks["ssh://s"].chunks) == b"".join(chunks)
    assert sinks["ssh://a"].finished and not sinks["ssh://a"].aborted
    assert outcome.answer_deadline(10 << 30) == 0.5 + 204.8  # a 10 GiB image may take minutes to register


# --- only the layers a target lacks travel ------------------------------------------------------------------


def d(c: str) -> str:
    return "sha256:" + c * 64


BASE, DEPS, CODE1, CODE2 = (ship.Layer(d("1"), 900 << 20), ship.Layer(d("2"), 200 << 20),
                            ship.Layer(d("3"), 4096), ship.Layer(d("4"), 5000))  # fmt: skip
V1, V2 = (BASE, DEPS, CODE1), (BASE, DEPS, CODE2)


def have(*images: tuple[ship.Layer, ...]) -> frozenset[str]:
    return ship.chains_of([[layer.diff_id for layer in img] for img in images])


def test_chain_ids_follow_dockers_rule() -> None:
    """chain(0) = diff(0); chain(i) = sha256 of "chain(i-1) diff(i)" (image-spec, config.md "ChainID")."""
    import hashlib

    a, b, c = d("a"), d("b"), d("c")
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert ship.chain_ids([a, b, c]) == (a, ab, "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest())
    assert ship.chain_ids([]) == ()
    assert ship.chain_ids([b, a])[1] != ab, "order matters"


def test_a_code_change_sends_only_the_code_layer() -> None:
    lp = ship.plan_layers(V2, have(V1))
    assert lp.send == (CODE2,) and lp.skip == (BASE, DEPS)
    assert lp.send_bytes == 5000 and lp.skip_bytes == (1100 << 20)
    assert lp.skip_ids == {BASE.diff_id, DEPS.diff_id}
    assert lp.to_text() == "1 of 3 layers (5 KiB; 2 already there, 1.1 GiB)"


def test_an_empty_target_gets_every_layer_and_a_full_one_none() -> None:
    assert ship.plan_layers(V2, frozenset()).send == V2
    assert ship.plan_layers(V2, frozenset()).to_text() == "all 3 layers (1.1 GiB)"
    full = ship.plan_layers(V2, have(V2))
    assert full.send == () and full.send_bytes == 0 and full.skip == V2


def test_a_layer_on_another_chain_does_not_count() -> None:
    """The target has DEPS's diff id, but on another base: Docker would not reuse it, so it travels."""
    other_base = ship.Layer(d("9"), 10)
    lp = ship.plan_layers(V2, have((other_base, DEPS, CODE2)))
    assert lp.send == V2


def test_a_diff_id_twice_travels_when_any_of_its_chains_is_missing() -> None:
    img = (BASE, CODE1, DEPS, CODE1)
    lp = ship.plan_layers(img, have((BASE, CODE1)))
    assert [layer.diff_id for layer in lp.send] == [CODE1.diff_id, DEPS.diff_id]
    assert lp.skip == (BASE,)


@pytest.mark.parametrize(
    ("history", "sizes"),
    [
        ((900, 0, 200, 0, 4096), (900, 200, 4096)),  # ENV/CMD steps made no layer
        ((900, 200, 4096), (900, 200, 4096)),
        ((900, 0, 0, 4096), (0, 0, 0)),  # a layer of size 0 cannot be told from an ENV step: unknown
    ],
)
def test_layer_sizes_from_history(history: tuple[int, ...], sizes: tuple[int, ...]) -> None:
    ids = [d("1"), d("2"), d("3")]
    assert ship.sized_layers(ids, history) == tuple(ship.Layer(i, n) for i, n in zip(ids, sizes, strict=True))


def test_layer_sizes_of_a_nodekit_image_with_its_empty_workdir_layer() -> None:
    """The CUDA image's history (docker history --human=false, oldest first): base, ARG/ENV steps, the three package
    layers, the launcher, WORKDIR (Docker's empty layer, size 0), ENTRYPOINT, the code. Every nodekit image has that
    empty layer; without telling it apart, every layer's size was unknown, and a partial push planned 0 bytes (no
    disk check, no relay) for a 2 GB torch upgrade."""
    from nodekit.image.layers import EMPTY_LAYER

    history = (172309936, 0, 0, 0, 0, 3415349364, 2165235000, 195477405, 116394, 0, 0, 12105)
    ids = [d("b"), d("c"), d("f"), d("p"), d("l"), EMPTY_LAYER, d("x")]
    sizes = [layer.size for layer in ship.sized_layers(ids, history)]
    assert sizes == [172309936, 3415349364, 2165235000, 195477405, 116394, 0, 12105]
    # an empty layer that is not Docker's fixed one still leaves the sizes unknown, as before
    assert {layer.size for layer in ship.sized_layers([*ids[:5], d("e"), ids[6]], history)} == {0}


SRC_L = ship.Source(ref=SRC.ref, image_id=NEW, size=int(1.2 * GiB), engine_id="engine-src", layers=V2)


def test_push_plan_carries_each_targets_layers() -> None:
    plan = ship.plan_push(
        SRC_L,
        [state("n1", ref_id=OLD, chains=have(V1)), state("n2", chains=frozenset()), state("n3")],
    )
    by = {s.target.name: s for s in plan.steps}
    assert actions(plan) == {"n1": "load", "n2": "load", "n3": "load"}
    assert by["n1"].layers is not None and by["n1"].layers.send == (CODE2,)
    assert by["n2"].layers is not None and by["n2"].layers.send == V2
    assert by["n3"].layers is None, "unknown chains: the whole image travels"
    assert (
        "load (gzip stream): has an older image under this name; sends 1 of 3 layers (5 KiB; 2 already"
        in plan.to_text()
    )


def test_disk_is_checked_against_what_travels() -> None:
    """A target that has 1.1 GiB of the image needs room for the code layer, not for the whole image again."""
    plan = ship.plan_push(SRC_L, [state("n1", chains=have(V1), free_bytes=100 << 20)])
    assert actions(plan) == {"n1": "load"}
    with pytest.raises(ShipError):
        ship.plan_push(SRC_L, [state("n1", chains=frozenset(), free_bytes=100 << 20)])


def archive(members: list[tuple[str, bytes]]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def members(data: bytes) -> dict[str, bytes]:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        out = {}
        for m in tar:
            f = tar.extractfile(m)
            out[m.name] = f.read() if f else b""
        return out


def chunked(data: bytes, n: int = 777) -> list[bytes]:
    return [data[i : i + n] for i in range(0, len(data), n)]


SAVED = [
    ("blobs/sha256/" + "1" * 64, b"base" * 50_000),
    ("blobs/sha256/" + "3" * 64, b"code" * 300),
    ("blobs/sha256/" + "c" * 64, b'{"config": true}'),
    ("index.json", b"{}"),
    ("manifest.json", b'[{"Layers": ["blobs/sha256/1...", "blobs/sha256/3..."]}]'),
    ("d/" + "x" * 150, b"a name longer than 100 characters (pax header)"),
]


def test_without_layers_drops_only_the_named_layer_files() -> None:
    from nodekit.ship.layers import WithoutLayers

    full = archive(SAVED)
    w = WithoutLayers(chunked(full), frozenset({d("1"), d("7")}))
    out = b"".join(w)
    assert w.skipped == [d("1")] and w.skipped_bytes == 200_000
    want = dict(SAVED)
    del want["blobs/sha256/" + "1" * 64]
    assert members(out) == want
    assert len(out) < len(full) - 199_000


def test_without_layers_passes_a_stream_cut_short_as_an_error() -> None:
    import tarfile

    from nodekit.ship.layers import WithoutLayers

    full = archive(SAVED)
    with pytest.raises(tarfile.TarError):
        b"".join(WithoutLayers(chunked(full[:150_000]), frozenset({d("3")})))


def test_fan_out_sends_each_target_only_what_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two targets that lack different layers get different streams; bytes sent and layers skipped are counted."""
    monkeypatch.setattr(fanout, "_verify", lambda src, step: None)
    base, code = ship.Layer(d("1"), 200_000), ship.Layer(d("3"), 1200)
    src = ship.Source(ref=SRC.ref, image_id=NEW, size=201_200, engine_id="engine-src", layers=(base, code))
    plan = ship.plan_push(
        src,
        [state("a", "ssh://a", chains=have((base,))), state("b", "ssh://b", chains=frozenset())],
        compress="none",
    )
    sinks = {"ssh://a": FakeSink(), "ssh://b": FakeSink()}
    full = archive(SAVED)
    result = ship.push(plan, RecordingReporter(), open_source=lambda r, ep: chunked(full, 4096),
                       open_sink=lambda ep: sinks[ep])  # fmt: skip
    got_a, got_b = (b"".join(sinks[ep].chunks) for ep in ("ssh://a", "ssh://b"))
    assert got_b == full
    assert "blobs/sha256/" + "1" * 64 not in members(got_a) and len(members(got_a)) == len(SAVED) - 1
    assert result.sent == {"a": len(got_a), "b": len(full)}
    assert result.layers_skipped == {"a": 1, "b": 0}


def test_a_layer_list_round_trips_and_bad_lines_are_named() -> None:
    chains = ship.chains_of([[d("1"), d("2")], [d("1"), d("3")]])
    text = ship.format_layer_list(chains, "ssh://me@node1")
    assert text.startswith("# nodekit layers") and len(text.splitlines()) == 4
    assert ship.parse_layer_list(text + "\n\n# a comment\n", "node1.layers") == chains
    with pytest.raises(UsageError) as e:
        ship.parse_layer_list(f"{d('1')}\nsha256:abc\n", "node1.layers")
    assert "node1.layers line 2 is not a layer chain id" in e.value.message
