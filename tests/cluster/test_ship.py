"""nodekit push / save / load against real, separate Docker engines (two hosts of a virtual cluster).

Small images made with `docker import` (no registry): each test states what the targets have, pushes, and checks
the image ids on every engine, including that a failed push leaves a target's existing images as they were.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import tarfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from nodekit import ship
from nodekit.errors import ShipError
from nodekit.system.progress import RecordingReporter
from tests.cluster.harness import Cluster, Host, clean
from tests.cluster.helpers import REF, Demo, SshKeys, fleet_on, ids, make_image, nodekit_argv, push_image, wipe

pytestmark = [pytest.mark.cluster, pytest.mark.docker]


@pytest.fixture(scope="module")
def pair(cluster_ready: None) -> Iterator[Cluster]:
    """Three engines shared by this module's tests: h0 is the source, h1 and h2 the targets."""
    c = Cluster(3, name="nks", owner=os.getpid(), decoy=False)
    c.up()
    try:
        yield c
    finally:
        c.down()


@pytest.fixture
def fresh(pair: Cluster) -> Cluster:
    """Every engine empty of images, then a new source image under REF on h0."""
    wipe(*pair.hosts)
    make_image(pair.hosts[0], REF, seed=random.randrange(1 << 30))
    return pair


def push_cli(c: Cluster, *targets: Host, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    to = [arg for h in targets for arg in ("--to", f"{h.name}={h.docker_host}")]
    return c.hosts[0].run(*nodekit_argv("push", REF, *to, *extra), timeout=300)


def test_push_loads_verifies_and_then_skips(fresh: Cluster) -> None:
    h0, h1, h2 = fresh.hosts
    want = h0.image_id(REF)
    dry = push_cli(fresh, h1, h2, extra=("--dry-run",))
    assert dry.returncode == 0, dry.stderr
    assert "h1" in dry.stdout and "load (none stream): does not have the image" in dry.stdout
    assert h1.image_id(REF) is None, "--dry-run changed a target"

    first = push_cli(fresh, h1, h2)
    assert first.returncode == 0, first.stdout + first.stderr
    assert h1.image_id(REF) == want and h2.image_id(REF) == want
    assert "image id verified on h1, h2" in first.stderr

    again = push_cli(fresh, h1, h2)
    assert again.returncode == 0, again.stderr
    assert "h1: skipped, already has" in again.stderr and "h2: skipped, already has" in again.stderr


@pytest.mark.parametrize("compress", ["gzip", "none"])
def test_compressed_streams_load(fresh: Cluster, compress: str) -> None:
    h0, h1, _ = fresh.hosts
    done = push_cli(fresh, h1, extra=("--compress", compress))
    assert done.returncode == 0, done.stderr
    assert f"{compress} stream" in done.stderr
    assert h1.image_id(REF) == h0.image_id(REF)


def test_a_target_with_the_image_under_another_name_is_only_tagged(fresh: Cluster) -> None:
    h0, h1, _ = fresh.hosts
    assert push_cli(fresh, h1).returncode == 0
    h1.docker("tag", REF, "nodekit/shiptest:elsewhere")
    h1.docker("rmi", REF)
    done = push_cli(fresh, h1)
    assert done.returncode == 0, done.stderr
    assert "h1: tagged nodekit/shiptest:current" in done.stderr
    assert h1.image_id(REF) == h0.image_id(REF)


def test_two_engines_that_share_an_engine_id_are_still_two_engines(cluster_ready: None) -> None:
    """Docker >= 23 keeps an engine's ID in its data root's ``engine-id`` file (copied from /etc/docker/key.json
    when that exists as the data root is made); cloned VMs share the file too. A target reporting the source's ID
    is still pushed to: skipped as "the source engine itself" without the image, `nodekit run` would say the image
    is on every host and the start would fail on the node without it ("a false already there")."""
    c = Cluster(2, name="nkid", owner=os.getpid(), decoy=False)
    clean(c.name, purge=True)  # data roots of an earlier run would keep their own IDs
    shared = str(uuid.uuid4())
    for h in c.hosts:
        h.data_root.mkdir(parents=True)
        (h.data_root / "engine-id").write_text(shared)  # as a cloned disk or key.json would leave it
    c.up()
    try:
        h0, h1 = c.hosts
        assert [h.docker("info", "--format", "{{.ID}}").stdout.strip() for h in c.hosts] == [shared, shared]
        want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=2)
        argv = nodekit_argv("push", REF, "--to", f"h1={h1.docker_host}", "--to", f"self=unix://{h0.sock}")
        dry = h0.run(*argv, "--dry-run", timeout=300)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert f"load (none stream): does not have the image (its engine ID is the source's, {shared}" in dry.stdout
        done = h0.run(*argv, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert h1.image_id(REF) == want, done.stderr
        # The source engine itself, named another way, is still known as such: it holds the image under REF.
        assert "self: skipped, is the source engine itself" in done.stderr, done.stderr
    finally:
        c.down(purge=True)


def _truncated(chunks: Iterable[bytes], keep: int) -> Iterator[bytes]:
    sent = 0
    for c in chunks:
        if sent + len(c) >= keep:
            yield c[: keep - sent]
            raise ShipError("docker save on the source failed: unexpected EOF")
        sent += len(c)
        yield c


def test_a_stream_cut_short_loads_nothing_and_keeps_the_old_image(fresh: Cluster) -> None:
    h0, h1, h2 = fresh.hosts
    old = make_image(h1, REF, seed=1)
    before = {h.name: ids(h) for h in (h1, h2)}
    src = ship.source_of(REF, h0.docker_host)
    targets = [ship.Target(h.name, h.docker_host) for h in (h1, h2)]
    plan = ship.plan_push(src, ship.survey(src, targets))
    assert [s.action for s in plan.steps] == ["load", "load"]

    def cut_short(ref: str, endpoint: str | None) -> Iterable[bytes]:
        return _truncated(iter(__import__("nodekit.system.docker").docker.SaveStream(ref, endpoint)), 3 << 20)

    with pytest.raises(ShipError) as e:
        ship.push(plan, RecordingReporter(), open_source=cut_short)
    assert "nothing was loaded" in e.value.message and e.value.node in ("h1", "h2")
    assert h1.image_id(REF) == old
    assert {h.name: ids(h) for h in (h1, h2)} == before


def test_a_corrupt_stream_is_refused_by_the_target(fresh: Cluster) -> None:
    """Bytes flipped in the middle of a layer: the target's docker load rejects the layer, nothing changes."""
    h0, h1, _ = fresh.hosts
    old = make_image(h1, REF, seed=2)
    before = ids(h1)
    src = ship.source_of(REF, h0.docker_host)
    plan = ship.plan_push(src, ship.survey(src, [ship.Target("h1", h1.docker_host)]))

    def corrupt(ref: str, endpoint: str | None) -> Iterable[bytes]:
        data = bytearray(b"".join(__import__("nodekit.system.docker").docker.SaveStream(ref, endpoint)))
        mid = len(data) // 2
        data[mid : mid + 64] = bytes(64)
        return [bytes(data)]

    with pytest.raises(ShipError) as e:
        ship.push(plan, RecordingReporter(), open_source=corrupt)
    assert e.value.node == "h1"
    assert h1.image_id(REF) == old and ids(h1) == before


def test_an_unreachable_target_fails_before_anything_moves(fresh: Cluster, tmp_path: Path) -> None:
    _, h1, _ = fresh.hosts
    gone = tmp_path / "nothing.sock"
    done = fresh.hosts[0].run(
        *nodekit_argv("push", REF, "--to", f"h1={h1.docker_host}", "--to", f"h9=unix://{gone}"), timeout=120
    )
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("nodekit: error: [h9] cannot push to h9: no Docker engine answers at unix://"), err
    assert "Fix:" in err
    assert h1.image_id(REF) is None


def test_a_stopped_host_is_named(fresh: Cluster) -> None:
    _, h1, h2 = fresh.hosts
    h2.stop()
    try:
        done = push_cli(fresh, h1, h2)
        assert done.returncode == 1
        assert "[h2] cannot push to h2" in done.stderr
        assert h1.image_id(REF) is None
    finally:
        fresh.restart(h2)


def test_too_little_disk_is_refused_before_loading(fresh: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine is on this machine (unix socket), so its free space is known: the push refuses up front."""
    h0, h1, _ = fresh.hosts
    real = ship.docker.engine_facts

    def tiny_disk(host: str | None) -> ship.docker.EngineFacts:
        f = real(host)
        if host != h1.docker_host:
            return f
        return ship.docker.EngineFacts(f.engine_id, f.server_version, f.root_dir, free_bytes=1 << 20)

    monkeypatch.setattr(ship.docker, "engine_facts", tiny_disk)
    src = ship.source_of(REF, h0.docker_host)
    with pytest.raises(ShipError) as e:
        ship.plan_push(src, ship.survey(src, [ship.Target("h1", h1.docker_host)]))
    assert e.value.node == "h1" and "1.0 MiB free" in e.value.message


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.zst"])
def test_save_then_load_a_file(fresh: Cluster, tmp_path: Path, suffix: str) -> None:
    h0, h1, _ = fresh.hosts
    path = tmp_path / f"image{suffix}"
    saved = h0.run(*nodekit_argv("save", str(path), REF))
    assert saved.returncode == 0, saved.stderr
    assert path.is_file() and not list(tmp_path.glob(".*.partial"))
    loaded = h1.run(*nodekit_argv("load", str(path), "--expect", h0.image_id(REF) or "?"))
    assert loaded.returncode == 0, loaded.stderr
    assert h1.image_id(REF) == h0.image_id(REF)
    assert f"{REF} {h0.image_id(REF)}" in loaded.stdout


@pytest.mark.parametrize("suffix", [".tar", ".tar.zst"])
def test_loading_a_truncated_file_changes_nothing(fresh: Cluster, tmp_path: Path, suffix: str) -> None:
    h0, h1, _ = fresh.hosts
    path = tmp_path / f"image{suffix}"
    assert h0.run(*nodekit_argv("save", str(path), REF)).returncode == 0
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    old = make_image(h1, REF, seed=3)
    before = ids(h1)
    loaded = h1.run(*nodekit_argv("load", str(path)))
    assert loaded.returncode == 1
    err = loaded.stderr.strip().splitlines()[-1]
    assert "is corrupt or truncated" in err and "Fix: nodekit save the image again" in err, err
    assert h1.image_id(REF) == old and ids(h1) == before


# --- only the layers a target lacks travel ------------------------------------------------------------------


def layer_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def load_layered(host: Host, ref: str, layers: list[bytes], *, env: str = "X=1") -> str:
    """An image with exactly these layers (base first), written as a docker save archive and loaded into
    ``host``'s engine: a build's layers without a build (a base, its dependencies, the project's code)."""
    import hashlib
    import json

    diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in layers]
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Env": [env]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": f"layer {i}"} for i in range(len(layers))],
    }).encode()  # fmt: skip
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    names = [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": names}]).encode()
    proc = subprocess.run(
        ["docker", "-H", host.docker_host, "load", "-q"],
        input=layer_tar({cfg_name: config, "manifest.json": manifest, **dict(zip(names, layers, strict=True))}),
        capture_output=True,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    got = host.image_id(ref)
    assert got is not None
    return got


BASE = layer_tar({"data/blob": random.Random(10).randbytes(8 << 20)})
DEPS = layer_tar({"deps/pkg.py": random.Random(11).randbytes(256 << 10)})


def code(n: int) -> bytes:
    return layer_tar({"app/train.py": f"print('version {n}')\n".encode()})


def layer_ids(host: Host, ref: str) -> list[str]:
    import json

    return list(json.loads(host.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref).stdout))


def in_layer_store(host: Host, chain_id: str) -> bool:
    """The classic layer store keeps each layer under its chain id: the proof our chain ids are Docker's."""
    return (host.data_root / "image" / "overlay2" / "layerdb" / chain_id.replace(":", "/")).is_dir()


def push_api(c: Cluster, *targets: Host, open_source: object = None) -> tuple[ship.PushPlan, ship.PushResult]:
    src = ship.source_of(REF, c.hosts[0].docker_host)
    plan = ship.plan_push(src, ship.survey(src, [ship.Target(h.name, h.docker_host) for h in targets]))
    kw = {"open_source": open_source} if open_source is not None else {}
    return plan, ship.push(plan, RecordingReporter(), **kw)  # type: ignore[arg-type]


def test_a_code_change_sends_only_the_code_layer(fresh: Cluster) -> None:
    h0, h1, h2 = fresh.hosts
    load_layered(h0, REF, [BASE, DEPS, code(1)])
    _, first = push_api(fresh, h1, h2)
    assert min(first.sent.values()) > 8 << 20, first.sent

    want = load_layered(h0, REF, [BASE, DEPS, code(2)])
    dry = push_cli(fresh, h1, h2, extra=("--dry-run",))
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("sends 1 of 3 layers") == 2, dry.stdout
    plan, result = push_api(fresh, h1, h2)
    code_layer = layer_ids(h0, REF)[2]
    for s in plan.steps:
        assert s.layers is not None and [layer.diff_id for layer in s.layers.send] == [code_layer]
    # The code layer (2 KiB as a tar) plus the config, manifest.json and index: not the 8 MiB base again.
    assert all(n < 64 << 10 for n in result.sent.values()), result.sent
    assert result.layers_skipped == {"h1": 2, "h2": 2}
    chains = ship.chain_ids(layer_ids(h0, REF))
    for h in (h1, h2):
        assert h.image_id(REF) == want
        assert all(in_layer_store(h, c) for c in chains)


def test_a_target_with_every_layer_receives_no_layer(fresh: Cluster) -> None:
    h0, h1, _ = fresh.hosts
    load_layered(h0, REF, [BASE, DEPS, code(3)])
    push_api(fresh, h1)
    # Same layers, another config (an environment variable changed): only the config travels.
    want = load_layered(h0, REF, [BASE, DEPS, code(3)], env="X=2")
    plan, result = push_api(fresh, h1)
    assert plan.steps[0].layers is not None and plan.steps[0].layers.send == ()
    assert result.sent["h1"] < 16 << 10 and result.layers_skipped["h1"] == 3, result
    assert h1.image_id(REF) == want
    # And a target that has the image itself receives nothing at all.
    plan, result = push_api(fresh, h1)
    assert [s.action for s in plan.steps] == ["skip"] and result.sent == {}


def test_a_layer_corrupted_in_transit_is_refused_and_leaves_nothing(fresh: Cluster) -> None:
    h0, h1, _ = fresh.hosts
    load_layered(h0, REF, [BASE, DEPS, code(4)])
    push_api(fresh, h1)
    old_id = h1.image_id(REF)
    load_layered(h0, REF, [BASE, DEPS, code(5)])
    code_layer = layer_ids(h0, REF)[2]
    before = ids(h1)
    src = ship.source_of(REF, h0.docker_host)
    step = ship.plan_push(src, ship.survey(src, [ship.Target("h1", h1.docker_host)])).steps[0]
    assert step.layers is not None and [layer.diff_id for layer in step.layers.send] == [code_layer]

    def flipped(ref: str, endpoint: str | None) -> Iterable[bytes]:
        """docker save, with one byte of the code layer's file content flipped on its way."""
        data = bytearray(b"".join(ship.docker.SaveStream(ref, endpoint)))
        with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
            blob = tar.getmember("blobs/sha256/" + code_layer.removeprefix("sha256:"))
        data[blob.offset_data + 512] ^= 0x01  # the first byte of train.py, after its tar header
        return [bytes(data)]

    with pytest.raises(ShipError) as e:
        push_api(fresh, h1, open_source=flipped)
    assert e.value.node == "h1"
    assert h1.image_id(REF) == old_id and ids(h1) == before
    assert not in_layer_store(h1, ship.chain_ids(layer_ids(h0, REF))[2]), "a half-loaded layer was left behind"


def test_an_incremental_save_loads_where_its_layers_are(fresh: Cluster, tmp_path: Path) -> None:
    """nodekit layers on the loading node, nodekit save --have on the one with the image, nodekit load: the file
    holds only the code layer; an engine that lacks the others refuses it by name and loads nothing."""
    h0, h1, h2 = fresh.hosts
    load_layered(h0, REF, [BASE, DEPS, code(6)])
    push_api(fresh, h1)
    want = load_layered(h0, REF, [BASE, DEPS, code(7)])
    listed = h1.run(*nodekit_argv("layers"))
    assert listed.returncode == 0, listed.stderr
    have = tmp_path / "h1.layers"
    have.write_text(listed.stdout)
    path = tmp_path / "code-only.tar"
    saved = h0.run(*nodekit_argv("save", str(path), REF, "--have", str(have)))
    assert saved.returncode == 0, saved.stderr
    assert "1 of 3 layers" in saved.stderr and path.stat().st_size < 64 << 10
    loaded = h1.run(*nodekit_argv("load", str(path), "--expect", want))
    assert loaded.returncode == 0, loaded.stderr
    assert h1.image_id(REF) == want

    before = ids(h2)
    refused = h2.run(*nodekit_argv("load", str(path)))
    assert refused.returncode == 1
    assert "leaves out layers that" in refused.stderr and "nodekit save --have" in refused.stderr, refused.stderr
    assert ids(h2) == before


def test_a_hung_engine_is_named_within_its_deadline(fresh: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dockerd that stops answering (here: SIGSTOP, as a wedged daemon) keeps no nodekit command that asks it
    anything waiting forever: each engine call ends on its deadline with one line naming the host, and no docker or
    compose process is left behind."""
    import signal
    import time

    from nodekit.errors import DeadlineError
    from nodekit.system import docker

    h2 = fresh.hosts[2]
    assert h2.pid is not None
    monkeypatch.setattr(docker.calls, "ENGINE_CALL_S", 3.0)
    os.kill(h2.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(DeadlineError) as e:
            docker.check_engine(h2.docker_host)
        assert f"docker version on {h2.docker_host} did not finish within 3 s" in e.value.one_line()
        with pytest.raises(DeadlineError, match=r"^docker compose ps of nodekit-hung"):
            docker.compose_ps(None, "nodekit-hung", host=h2.docker_host)
        assert time.monotonic() - started < 60  # a deadline, not a timing: two 3 s calls, not forever
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", f"-H {h2.docker_host}"], capture_output=True, text=True).stdout.split()
        assert left == [], f"docker processes left behind: {left}"
    finally:
        os.kill(h2.pid, signal.SIGCONT)
    assert docker.check_engine(h2.docker_host).server_version  # and it answers again


@pytest.fixture(scope="module")
def stores(cluster_ready: None) -> Iterator[Cluster]:
    """h0 with the classic layer store, h1 and h2 with Docker's containerd image store (the default of new
    installs in newer Docker), each a real dockerd started with that feature."""
    c = Cluster(3, name="nkd", owner=os.getpid(), decoy=False)
    c.hosts[1].containerd_store = c.hosts[2].containerd_store = True
    c.up()
    try:
        yield c
    finally:
        c.down()


def test_the_containerd_image_store_is_detected_and_an_image_crosses_stores_by_its_identity(
    stores: Cluster,
) -> None:
    """An image nodekit did not build (so whose id on the other store it cannot know) goes from a classic-store
    engine to a containerd-store one and is verified there by its identity; the two stores give it two ids."""
    from nodekit.system import docker

    h0, h1, _ = stores.hosts
    assert [docker.engine_facts(h.docker_host).containerd_store for h in stores.hosts] == [False, True, True]
    wipe(*stores.hosts)
    source_id = make_image(h0, REF, seed=random.randrange(1 << 30))
    dry = push_cli(stores, h1, extra=("--dry-run",))  # the plan says why it loads: the push's output does not
    assert dry.returncode == 0 and "it keeps images in the other image store" in dry.stdout, dry.stdout + dry.stderr
    done = push_cli(stores, h1)
    assert done.returncode == 0, done.stderr
    there = docker.require_image(REF, h1.docker_host)
    assert there.id != source_id and there.identity == docker.require_image(REF, h0.docker_host).identity


def test_a_push_between_containerd_stores_loads_and_verifies(stores: Cluster) -> None:
    _, h1, h2 = stores.hosts
    wipe(h1, h2)
    source_id = make_image(h1, REF, seed=random.randrange(1 << 30))
    first = h1.run(*nodekit_argv("push", REF, "--to", f"h2={h2.docker_host}"), timeout=300)
    assert first.returncode == 0, first.stderr
    assert "image id verified on h2" in first.stdout + first.stderr
    assert h2.image_id(REF) == source_id
    again = h1.run(*nodekit_argv("push", REF, "--to", f"h2={h2.docker_host}"), timeout=300)
    assert again.returncode == 0 and "already has" in again.stdout + again.stderr


def test_a_fleet_across_image_stores_runs_the_job(
    stores: Cluster, demo: Demo, ssh_keys: SshKeys, tmp_path: Path
) -> None:
    """The head's engine keeps images in the classic store, two nodes in the containerd store (a cluster upgraded
    machine by machine): `nodekit run` ships the image (a relay chain through both stores) and the 3-node job ends
    with equal checksums; each engine names the image its own way, the preflight saw one identity."""
    from nodekit.system import docker

    h0, h1, h2 = stores.hosts
    wipe(h1, h2)
    push_image(demo.ref, None, [h0])
    for fleet in fleet_on(stores, ssh_keys, tmp_path):
        project = fleet.project(demo, tmp_path)
        log = tmp_path / "run.log"
        proc = fleet.run(project, "--image", demo.ref, log=log)
        try:
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        out = log.read_text(errors="replace")
        assert code == 0, out[-5000:]
        assert "nodekit preflight: ok, 3/3 nodes, identical stacks" in out, out[-5000:]
        result = json.loads((project / "outputs" / "result.json").read_text())
        assert result["world_size"] == 3 and result["checksums_equal"] is True
    infos = [docker.require_image(demo.ref, h.docker_host) for h in (h0, h1, h2)]
    assert infos[0].id == demo.image_id and infos[1].id == infos[2].id != infos[0].id
    assert len({i.identity for i in infos}) == 1
