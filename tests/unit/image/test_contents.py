"""What an image archive will do to an engine, read before any engine sees it (nodekit/image/contents.py): crafted
archives of the three attacks of issue 44 (N4). The real `docker load` of them, on both stores, is in
tests/integration/test_load_checked.py."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from nodekit.image import archive
from nodekit.image.archive import Image, layer_descriptor
from nodekit.image.contents import BadArchive, Contents, check_expected, parse_expect, read_contents
from nodekit.ship.scan import scan
from tests.factories import tar_of


def image(tmp_path: Path, text: bytes) -> tuple[Image, dict[str, Path]]:
    digest = "sha256:" + hashlib.sha256(text).hexdigest()
    (tmp_path / digest[7:]).write_bytes(text)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/true"]},
                         "rootfs": {"type": "layers", "diff_ids": [digest]}}).encode()  # fmt: skip
    return Image(config=config, layers=(layer_descriptor(digest, len(text)),)), {digest: tmp_path / digest[7:]}


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def saved(img: Image, ref: str | None, files: dict[str, Path]) -> dict[str, bytes]:
    """The members of the archive nodekit save writes for ``img`` named ``ref``."""
    return members(b"".join(archive.archive(img, ref, files)))


def read(files: dict[str, bytes]) -> Contents:
    """read_contents of these files, through the same scan nodekit load uses."""
    return read_contents(scan([tar_of(files)], lambda _: None).members)


Trio = tuple[Image, Image, dict[str, Path]]


@pytest.fixture
def good_and_trojan(tmp_path: Path) -> Trio:
    good, f1 = image(tmp_path, b"GOOD image")
    trojan, f2 = image(tmp_path, b"TROJAN image")
    return good, trojan, {**f1, **f2}


def test_a_file_nodekit_save_wrote_is_its_one_image_under_both_ids(good_and_trojan: Trio) -> None:
    good, _, files = good_and_trojan
    got = read(saved(good, "nodekit/audit5-victim:1", files))
    assert len(got.images) == 1 and got.tags == ("nodekit/audit5-victim:1",)
    one = got.images[0]
    assert one.config_digest == good.config_digest and one.target_digest == good.manifest_digest
    assert one.id_on(False) == good.config_digest and one.id_on(True) == good.manifest_digest
    # What nodekit save printed on either store, short or whole, with or without sha256:.
    for expect in (good.config_digest[7:19], good.manifest_digest[7:19], good.config_digest, good.manifest_digest):
        hexdigits = parse_expect(expect)
        assert hexdigits is not None
        check_expected(got, hexdigits)


def test_attack_a_a_trojan_tagged_as_the_victim_is_refused(good_and_trojan: Trio) -> None:
    good, trojan, files = good_and_trojan
    got = read(saved(trojan, "nodekit/audit5-victim:1", files))
    with pytest.raises(BadArchive, match="not " + good.config_digest[7:19]):
        check_expected(got, good.config_digest[7:19])


def test_attack_b_the_expected_image_beside_a_trojan_is_refused(good_and_trojan: Trio) -> None:
    good, trojan, files = good_and_trojan
    a = saved(good, "nodekit/audit5-good:1", files)
    b = saved(trojan, "nodekit/audit5-victim:1", files)
    both = {**a, **b}
    both["manifest.json"] = json.dumps(json.loads(a["manifest.json"]) + json.loads(b["manifest.json"])).encode()
    index = json.loads(a["index.json"])
    index["manifests"] += json.loads(b["index.json"])["manifests"]
    both["index.json"] = json.dumps(index).encode()
    got = read(both)
    assert len(got.images) == 2
    with pytest.raises(BadArchive, match="holds 2 images"):
        check_expected(got, good.config_digest[7:])


def test_attack_c_an_empty_or_short_expect_is_no_image_id() -> None:
    for bad in ("", "sha256:", "af5634fb6d0", "AF5634FB6D0E", "af5634fb6d0e!", "g" * 12, "a" * 65, " af5634fb6d0e"):
        assert parse_expect(bad) is None, bad
    assert parse_expect("af5634fb6d0e") == "af5634fb6d0e"
    assert parse_expect("sha256:" + "a" * 64) == "a" * 64


def test_the_config_is_named_by_its_bytes_not_its_file_name(good_and_trojan: Trio) -> None:
    """A file that puts the trojan's config under the good config's file name is the trojan to the classic store."""
    good, trojan, files = good_and_trojan
    forged = saved(good, "nodekit/audit5-victim:1", files)
    forged[archive.blob_name(good.config_digest)] = trojan.config
    got = read({k: v for k, v in forged.items() if k != "oci-layout"})
    with pytest.raises(BadArchive, match="not"):
        check_expected(got, good.config_digest[7:])


def test_a_file_whose_halves_disagree_is_refused(good_and_trojan: Trio) -> None:
    """manifest.json (the classic store's) and index.json (the containerd store's) must describe one image and tag it
    alike: else each store would load something else."""
    good, trojan, files = good_and_trojan
    a = saved(good, "nodekit/audit5-good:1", files)
    b = saved(trojan, "nodekit/audit5-victim:1", files)
    # index.json: the good image; manifest.json: the trojan.
    mixed = {**a, **b, "index.json": a["index.json"], "manifest.json": b["manifest.json"]}
    with pytest.raises(BadArchive, match=r"index.json names image .* 0 times"):
        read(mixed)
    # One image, but tagged as the victim for one store only.
    retagged = dict(a)
    doc = json.loads(a["manifest.json"])
    doc[0]["RepoTags"] = ["nodekit/audit5-victim:1"]
    retagged["manifest.json"] = json.dumps(doc).encode()
    with pytest.raises(BadArchive, match="tag it differently"):
        read(retagged)


def test_more_than_one_tag_for_the_expected_image_is_refused(good_and_trojan: Trio) -> None:
    good, _, files = good_and_trojan
    a = saved(good, "nodekit/audit5-good:1", files)
    doc = json.loads(a["manifest.json"])
    doc[0]["RepoTags"] = ["nodekit/audit5-good:1", "nodekit/audit5-victim:1"]
    a["manifest.json"] = json.dumps(doc).encode()
    index = json.loads(a["index.json"])
    second = json.loads(json.dumps(index["manifests"][0]))
    second["annotations"]["io.containerd.image.name"] = "docker.io/nodekit/audit5-victim:1"
    index["manifests"].append(second)
    a["index.json"] = json.dumps(index).encode()
    got = read(a)
    assert got.tags == ("nodekit/audit5-good:1", "nodekit/audit5-victim:1")
    with pytest.raises(BadArchive, match=r"tags .* 2 times"):
        check_expected(got, good.config_digest[7:])


def test_an_untagged_file_and_a_docker_format_file_are_read(good_and_trojan: Trio) -> None:
    good, _, files = good_and_trojan
    got = read(saved(good, None, files))
    assert got.tags == () and got.images[0].tags == ()
    check_expected(got, good.manifest_digest[7:])
    # Without the OCI layout the containerd store composes a manifest of its own: only the config digest is known.
    old = {k: v for k, v in saved(good, "x:1", files).items() if k not in ("oci-layout", "index.json")}
    got = read(old)
    assert got.images[0].target_digest is None and got.tags == ("x:1",)
    check_expected(got, good.config_digest[7:])
    with pytest.raises(BadArchive, match="not"):
        check_expected(got, good.manifest_digest[7:])
