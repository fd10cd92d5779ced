"""Image archives nodekit writes (nodekit/image/archive.py): the bytes both image stores load. The real engines
loading them are tested in tests/integration (both stores) and tests/cluster."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from nodekit.image import archive
from nodekit.image.archive import Descriptor, Image, chain_ids, layer_descriptor

# nodekit/base:bookworm as Docker 26.1.5 reports it: its config digest (the classic store's id), its one layer,
# and the id the containerd store gave it (= the manifest digest Docker's classic `docker save` composes for it).
BASE_CONFIG_DIGEST = "sha256:7e121ebbddd1247c2bd3c35de45e36268de019219dfce38501b7cbf352c2355d"
BASE_LAYER = "sha256:72f0ea92df68f3a75f1c867b08b6f8d9e471654397662c4314246a647b3f7160"
BASE_CONTAINERD_ID = "sha256:208abfa6d6afe89723716e944d0dfbe0c19c4c9cb85d9da87de1d0c873cc0fd4"


def test_the_manifest_is_the_bytes_docker_writes_so_the_containerd_id_is_known_before_loading() -> None:
    manifest = archive.manifest_bytes(BASE_CONFIG_DIGEST, 364, [layer_descriptor(BASE_LAYER, 178480640)])
    assert "sha256:" + hashlib.sha256(manifest).hexdigest() == BASE_CONTAINERD_ID


def config(layers: list[str]) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": layers}},
                      sort_keys=True, separators=(",", ":")).encode()  # fmt: skip


def test_an_image_has_one_id_per_store() -> None:
    cfg = config(["sha256:" + "a" * 64])
    image = Image(config=cfg, layers=(layer_descriptor("sha256:" + "a" * 64, 10),))
    assert image.id_on(False) == image.config_digest == "sha256:" + hashlib.sha256(cfg).hexdigest()
    assert image.id_on(True) == image.manifest_digest != image.config_digest
    assert image.diff_ids == ("sha256:" + "a" * 64,)


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_the_archive_holds_both_layouts_and_only_the_blobs_given(tmp_path: Path) -> None:
    low, high = b"low layer bytes", b"high layer"
    d_low, d_high = ("sha256:" + hashlib.sha256(b).hexdigest() for b in (low, high))
    (tmp_path / "high").write_bytes(high)
    image = Image(config=config([d_low, d_high]), layers=(layer_descriptor(d_low, len(low)),
                                                          layer_descriptor(d_high, len(high))))  # fmt: skip
    got = members(b"".join(archive.archive(image, "nodekit/demo:1", {d_high: tmp_path / "high"})))
    blobs = {f"blobs/sha256/{d[7:]}" for d in (d_high, image.config_digest, image.manifest_digest)}
    assert set(got) == blobs | {"index.json", "oci-layout", "manifest.json"}
    (entry,) = json.loads(got["manifest.json"])
    # Docker's layout: the classic store reads this, and opens a layer file only when it lacks the layer's chain.
    assert entry == {"Config": f"blobs/sha256/{image.config_digest[7:]}", "RepoTags": ["nodekit/demo:1"],
                     "Layers": [f"blobs/sha256/{d_low[7:]}", f"blobs/sha256/{d_high[7:]}"]}  # fmt: skip
    # The OCI layout: the containerd store reads this, names the image as containerd spells it.
    (m,) = json.loads(got["index.json"])["manifests"]
    assert m["digest"] == image.manifest_digest and m["size"] == len(image.manifest)
    assert m["annotations"] == {"io.containerd.image.name": "docker.io/nodekit/demo:1",
                                "org.opencontainers.image.ref.name": "1"}  # fmt: skip
    assert got[f"blobs/sha256/{image.manifest_digest[7:]}"] == image.manifest
    assert got[f"blobs/sha256/{d_high[7:]}"] == high


def test_an_untagged_archive_names_no_image_and_a_blob_from_elsewhere_is_streamed_in() -> None:
    base = b"base layer from docker save"
    d = "sha256:" + hashlib.sha256(base).hexdigest()
    image = Image(config=config([d]), layers=(Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", d, len(base)),))
    got = members(b"".join(archive.archive(image, None, {}, [archive.Member(d, len(base), [base[:5], base[5:]])])))
    assert got[f"blobs/sha256/{d[7:]}"] == base
    assert json.loads(got["manifest.json"])[0]["RepoTags"] is None
    assert "annotations" not in json.loads(got["index.json"])["manifests"][0]


def test_chain_ids_name_a_layer_with_everything_below_it() -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert chain_ids([a, b]) == (a, "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest())
    assert chain_ids([b, a])[1] != chain_ids([a, b])[1]
