"""Pure: what an image archive (``docker save``'s or ``nodekit save``'s) will do to an engine, read from its small
files before any engine sees it: which images each image store creates from it, the id each store gives them and
the tags each store writes.

The two stores read different halves of one archive (see :mod:`nodekit.image.archive`): the classic store reads
``manifest.json`` (the config file each entry names: its sha256 is the image id; ``RepoTags`` are the tags it
moves), the containerd store reads ``index.json`` when ``oci-layout`` is there (each entry's digest is the image id;
its ``io.containerd.image.name`` annotation, else its ``org.opencontainers.image.ref.name``, the tag it moves) and
``manifest.json`` otherwise. A hostile file can make the halves disagree, so each is read and both are checked.

Blobs are named by what their bytes hash to, never by their file names: the classic store hashes the config file it
reads and the containerd store stores every blob under its own digest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodekit.system.docker.models import image_identity

LAYOUT_VERSION = "1.0.0"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
ATTESTATION = "attestation-manifest"
EXPECT = re.compile(r"(?:sha256:)?([0-9a-f]{12,64})")


class BadArchive(ValueError):
    """The archive is not one nodekit can check, or not the image it was expected to be (the message says which)."""


@dataclass(frozen=True)
class ArchivedImage:
    """One image of the archive, as the classic store reads it, with what the containerd store makes of it."""

    config_digest: str
    """The classic store's id for it (the sha256 of its config file)."""
    target_digest: str | None
    """The containerd store's id for it (its ``index.json`` entry); None when that store reads ``manifest.json``
    (no OCI layout) and composes a manifest of its own."""
    tags: tuple[str, ...]
    """The tags a load writes for it, as Docker prints them (``nodekit/x:1``)."""
    identity: str
    """:func:`nodekit.system.docker.models.image_identity` of its config: what ``docker image inspect`` of it will
    give on either store."""

    def id_on(self, containerd_store: bool) -> str | None:
        return self.target_digest if containerd_store else self.config_digest

    def is_(self, expect: str) -> bool:
        """Whether its id on either store starts with ``expect`` (hex digits, from :func:`parse_expect`)."""
        ids = (self.config_digest, self.target_digest)
        return any(d.removeprefix("sha256:").startswith(expect) for d in ids if d)


@dataclass(frozen=True)
class Contents:
    images: tuple[ArchivedImage, ...]
    tags: tuple[str, ...]
    """Every tag a load of the archive writes, on either store."""

    def to_text(self) -> str:
        if not self.images:
            return "no image"
        return ", ".join(f"{' '.join(i.tags) or 'an untagged image'} {_short(i.config_digest)}" for i in self.images)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def familiar(ref: str) -> str:
    """``ref`` as Docker prints it: ``docker.io/library/x:1`` -> ``x:1``, ``docker.io/nodekit/x`` ->
    ``nodekit/x:latest`` (both stores tag a name without a tag ``latest``)."""
    name = ref.removeprefix("docker.io/").removeprefix("library/")
    if "@" in name:
        raise BadArchive(f"it names {ref!r}, a digest, not a tag")
    if ":" not in name.rpartition("/")[2]:
        name += ":latest"
    return name


def parse_expect(value: str) -> str | None:
    """The hex digits of an ``--expect`` value (``sha256:`` optional, 12 to 64 lowercase hex digits: what
    ``nodekit save`` printed, or more of it); None when it is not one. An empty prefix matches every image."""
    m = EXPECT.fullmatch(value)
    return m.group(1) if m else None


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def _json(members: Mapping[str, bytes], name: str) -> Any:
    try:
        return json.loads(members[name])
    except (ValueError, UnicodeDecodeError) as e:
        raise BadArchive(f"its {name} is not JSON ({e})") from None


def _blob(members: Mapping[str, bytes], by_digest: Mapping[str, bytes], what: str, digest: str) -> Any:
    data = by_digest.get(digest)
    if data is None:
        raise BadArchive(f"its {what} {_short(digest)} is not in it")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadArchive(f"its {what} {_short(digest)} is not JSON ({e})") from None


def _strings(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadArchive(f"its {what} is not a list of strings")
    return value


def _classic(members: Mapping[str, bytes]) -> list[tuple[str, tuple[str, ...], bytes]]:
    """(config digest, tags, config bytes) of each ``manifest.json`` entry, as the classic store reads them."""
    if "manifest.json" not in members:
        raise BadArchive("it has no manifest.json (not a docker save archive)")
    doc = _json(members, "manifest.json")
    if not isinstance(doc, list) or not all(isinstance(e, dict) for e in doc):
        raise BadArchive("its manifest.json is not a list of images")
    out = []
    for entry in doc:
        config = entry.get("Config")
        if not isinstance(config, str) or _name(config) not in members:
            raise BadArchive(f"its manifest.json names a config {config!r} that is not in it")
        _strings(entry.get("Layers"), "manifest.json's Layers")
        data = members[_name(config)]
        tags = tuple(familiar(t) for t in _strings(entry.get("RepoTags"), "manifest.json's RepoTags"))
        out.append((sha256(data), tags, data))
    return out


def _containerd(members: Mapping[str, bytes], by_digest: Mapping[str, bytes]) -> list[tuple[str, str, str | None]]:
    """(target digest, config digest, tag or None) of each ``index.json`` entry, as the containerd store reads them."""
    if "index.json" not in members:
        raise BadArchive("it has oci-layout but no index.json")
    doc = _json(members, "index.json")
    entries = doc.get("manifests") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadArchive("its index.json lists no manifests")
    out = []
    for e in entries:
        digest, notes = e.get("digest"), e.get("annotations") or {}
        if not isinstance(digest, str) or not isinstance(notes, dict):
            raise BadArchive("an entry of its index.json has no digest")
        name = notes.get("io.containerd.image.name") or notes.get("org.opencontainers.image.ref.name")
        out.append((digest, _config_of(by_digest, digest), familiar(str(name)) if name else None))
    return out


def _config_of(by_digest: Mapping[str, bytes], digest: str, depth: int = 0) -> str:
    """The config digest of the image the manifest (or index of one image) ``digest`` describes."""
    doc = _blob({}, by_digest, "manifest", digest)
    if not isinstance(doc, dict):
        raise BadArchive(f"its manifest {_short(digest)} is not an object")
    if doc.get("mediaType") in INDEX_TYPES or ("manifests" in doc and "config" not in doc):
        children = [m for m in doc.get("manifests") or [] if isinstance(m, dict)
                    and (m.get("annotations") or {}).get("vnd.docker.reference.type") != ATTESTATION
                    and str(m.get("digest")) in by_digest]  # fmt: skip
        if depth > 0 or len(children) != 1:
            raise BadArchive(f"its index {_short(digest)} holds {len(children)} images, not one")
        return _config_of(by_digest, str(children[0]["digest"]), depth + 1)
    config = doc.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
        raise BadArchive(f"its manifest {_short(digest)} names no config")
    return str(config["digest"])


def _identity(config: bytes) -> str:
    try:
        doc = json.loads(config)
        layers = doc["rootfs"]["diff_ids"]
        return image_identity(layers, doc.get("config") or {}, str(doc.get("os") or ""),
                              str(doc.get("architecture") or ""), str(doc.get("variant") or ""))  # fmt: skip
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise BadArchive(f"its image config is not one Docker reads ({e})") from None


def _name(path: str) -> str:
    """A member name as both stores resolve it (``./a/../manifest.json`` is ``manifest.json``)."""
    import posixpath

    return posixpath.normpath("/" + path).lstrip("/")


def read_contents(members: Mapping[str, bytes]) -> Contents:
    """What loading an archive does, from its small files (``members``: normalized name -> bytes). Raises
    BadArchive when it cannot be read, or when the two stores would make different images or tags of it."""
    by_digest = {sha256(data): data for data in members.values()}
    classic = _classic(members)
    layout = members.get("oci-layout")
    if layout is None:
        ctd = None
    else:
        version = _json(members, "oci-layout")
        if not isinstance(version, dict) or version.get("imageLayoutVersion") != LAYOUT_VERSION:
            raise BadArchive(f"its oci-layout is not version {LAYOUT_VERSION}")
        ctd = _containerd(members, by_digest)
    images = []
    for config, tags, data in classic:
        targets = None if ctd is None else {t for t, c, _ in ctd if c == config}
        if targets is not None and len(targets) != 1:
            raise BadArchive(f"its index.json names image {_short(config)} {len(targets)} times, not once")
        images.append(ArchivedImage(config, targets.pop() if targets else None, tags, _identity(data)))
    if ctd is not None:
        configs = {c for c, _, _ in classic}
        for target, config, _ in ctd:
            if config not in configs:
                raise BadArchive(f"its index.json names an image ({_short(target)}) that manifest.json does not")
        # Which tags each store writes: the same ones, for the same image, or the stores would disagree.
        classic_tags = {(t, c) for c, tags, _ in classic for t in tags}
        ctd_tags = {(tag, config) for _, config, tag in ctd if tag is not None}
        if classic_tags != ctd_tags:
            raise BadArchive("its manifest.json and index.json tag it differently (a file crafted for one store)")
    tags = tuple(sorted({t for i in images for t in i.tags}))
    return Contents(tuple(images), tags)


def check_expected(contents: Contents, expect: str) -> None:
    """Raises BadArchive unless ``contents`` is exactly one image whose id on either store starts with ``expect``
    (hex digits, from :func:`parse_expect`), tagged at most once, by the same tag on both stores."""
    if len(contents.images) != 1:
        raise BadArchive(f"it holds {len(contents.images)} images ({contents.to_text()}), not just {expect}")
    image = contents.images[0]
    if not image.is_(expect):
        raise BadArchive(f"it holds {contents.to_text()}, not {expect}")
    if len(image.tags) > 1:
        raise BadArchive(f"it tags {expect} {len(image.tags)} times ({', '.join(image.tags)}); nodekit save writes one")
