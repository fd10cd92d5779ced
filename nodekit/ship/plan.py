"""Planning a push, pure: which target engines are skipped, re-tagged or loaded, with which compression, and which
of the image's layers each loading target lacks (only those travel).

:func:`plan_push` takes what each target engine has (:class:`TargetState`, gathered by
:func:`nodekit.ship.engines.survey`) as data and returns a :class:`PushPlan`; it refuses before anything moves when a
target is unreachable, named twice or short of disk. :func:`parse_target` reads ``--to``, :func:`choose_codec` and
:func:`codec_for_file` pick the compression. Nothing here calls Docker, runs a command or reads the environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from nodekit.errors import ShipError, UsageError
from nodekit.image.archive import chain_ids
from nodekit.image.layers import EMPTY_LAYER
from nodekit.ship.codecs import ZSTD_LOAD_CRASH, Codec, Compress, choose_codec

Action = Literal["skip", "tag", "load"]

SCHEMES = ("ssh", "tcp", "unix")
# `docker load` keeps the whole archive in its data root's tmp/ while it unpacks the layers next to it.
DISK_FACTOR = 2.2


@dataclass(frozen=True)
class Target:
    """A Docker engine to ship to: ``name`` is how messages call it, ``endpoint`` how docker reaches it."""

    name: str
    endpoint: str


def parse_target(spec: str) -> Target:
    """``ssh://user@host``, ``tcp://host:2376``, ``unix:///path``, optionally named: ``node1=ssh://user@host``."""
    name, sep, endpoint = spec.partition("=")
    if not sep or "://" in name:
        name, endpoint = "", spec
    scheme = urlsplit(endpoint).scheme
    if scheme not in SCHEMES:
        raise UsageError(
            f"--to {spec!r} is not a Docker endpoint",
            fix="--to ssh://user@host, --to tcp://host:2376 or --to unix:///var/run/docker.sock "
            "(optionally named: --to node1=ssh://user@host)",
        )
    return Target(name=name or _short(endpoint), endpoint=endpoint)


def _short(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        return endpoint
    return parts.netloc or endpoint


@dataclass(frozen=True)
class Layer:
    """One layer of an image: its diff id (``sha256:`` of the uncompressed layer tar, as in the image config's
    ``rootfs.diff_ids``) and its size in bytes (an estimate from ``docker history``; 0 when unknown)."""

    diff_id: str
    size: int = 0


def sized_layers(diff_ids: Sequence[str], history_sizes: Sequence[int]) -> tuple[Layer, ...]:
    """The layers with their sizes from ``docker history`` (oldest first). History also lists steps that made no
    layer (ENV, CMD: size 0); the entries with a size are the layers in order when there are as many of them as
    diff ids. A layer with no content at all is Docker's empty layer (``WORKDIR`` of a directory that exists: every
    nodekit image has one), whose diff id is fixed: it is given size 0 and the sized entries fill the other layers.
    Otherwise (another layer of size 0, which cannot be told from such a step) the sizes are unknown: 0."""
    sized = [n for n in history_sizes if n > 0]
    if len(history_sizes) == len(diff_ids):
        return tuple(Layer(d, n) for d, n in zip(diff_ids, history_sizes, strict=True))
    if len(sized) != sum(1 for d in diff_ids if d != EMPTY_LAYER):
        return tuple(Layer(d, 0) for d in diff_ids)
    rest = iter(sized)
    return tuple(Layer(d, 0 if d == EMPTY_LAYER else next(rest)) for d in diff_ids)


@dataclass(frozen=True)
class LayerPlan:
    """Which of the image's layers travel to one target (``send``) and which it already has (``skip``); each diff
    id once, base first. ``docker load`` reuses a layer whose chain id exists without opening its file, so an
    archive without the skipped layer files loads to the same image id."""

    send: tuple[Layer, ...]
    skip: tuple[Layer, ...]

    @property
    def send_bytes(self) -> int:
        return sum(layer.size for layer in self.send)

    @property
    def skip_bytes(self) -> int:
        return sum(layer.size for layer in self.skip)

    @property
    def skip_ids(self) -> frozenset[str]:
        return frozenset(layer.diff_id for layer in self.skip)

    def to_text(self) -> str:
        n = len(self.send) + len(self.skip)
        if not self.skip:
            return f"all {n} layers ({size_text(self.send_bytes)})"
        return (
            f"{len(self.send)} of {n} layers ({size_text(self.send_bytes)}; {len(self.skip)} already there, "
            f"{size_text(self.skip_bytes)})"
        )


def travelling_bytes(image_size: int, layers: LayerPlan | None) -> int:
    """What travels to a target: the layers it lacks when some are left out, else the whole image."""
    return layers.send_bytes if layers is not None and layers.skip else image_size


def plan_layers(layers: Sequence[Layer], have: frozenset[str]) -> LayerPlan:
    """Pure: the layers a target whose layer store holds the chain ids ``have`` lacks. A layer file is sent when
    the chain at *any* position where its diff id occurs is missing there (the same diff id can sit on two
    different chains, and the archive holds its file once)."""
    chains = chain_ids([layer.diff_id for layer in layers])
    needed: dict[str, bool] = {}
    first: dict[str, Layer] = {}
    for layer, chain in zip(layers, chains, strict=True):
        first.setdefault(layer.diff_id, layer)
        needed[layer.diff_id] = needed.get(layer.diff_id, False) or chain not in have
    send = tuple(first[d] for d, need in needed.items() if need)
    skip = tuple(first[d] for d, need in needed.items() if not need)
    return LayerPlan(send=send, skip=skip)


LAYER_LIST_HEAD = "# nodekit layers: the layer chain ids one Docker engine holds"


def format_layer_list(chains: Iterable[str], engine: str) -> str:
    """What ``nodekit layers`` prints: a comment line, then one chain id a line (sorted, so lists diff well)."""
    return "\n".join([f"{LAYER_LIST_HEAD} ({engine})", *sorted(chains)]) + "\n"


def parse_layer_list(text: str, source: str) -> frozenset[str]:
    """The chain ids in a list ``nodekit layers`` printed (``#`` comments and blank lines ignored). UsageError
    naming the first line that is not a ``sha256:`` digest."""
    chains = set()
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        algo, _, digest = line.partition(":")
        if algo != "sha256" or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise UsageError(
                f"{source} line {n} is not a layer chain id: {line[:80]!r}",
                fix="write the list with `nodekit layers > FILE` on the node that will load the archive",
            )
        chains.add(line)
    return frozenset(chains)


@dataclass(frozen=True)
class TargetState:
    """What one target engine has, as gathered by ``survey``; ``error`` is set when it could not be asked."""

    target: Target
    error: str | None = None
    engine_id: str = ""
    server_version: str = ""
    ref_id: str | None = None
    """The image id that the pushed reference names there (None: no such reference)."""
    ref_identity: str | None = None
    """That image's identity (:attr:`nodekit.system.docker.ImageInfo.identity`: equal for one image on any store)."""
    has_image: bool = False
    """The source's image is there (under whatever name), with the id that target's store gives it."""
    free_bytes: int | None = None
    chains: frozenset[str] | None = None
    """Every layer chain id the target's engine holds; None when unknown (then every layer is sent)."""
    containerd_store: bool = False
    """The target's engine keeps images in Docker's containerd image store."""
    zstd: bool = False
    """The target (an ``ssh://`` node) has the zstd command: a zstd stream is decompressed there before its engine."""


@dataclass(frozen=True)
class Source:
    ref: str
    image_id: str
    size: int
    engine_id: str
    endpoint: str | None = None
    layers: tuple[Layer, ...] = field(default=())
    """The image's layers, base first; empty when unknown (then every layer is sent)."""
    containerd_store: bool = False
    """The source engine keeps images in Docker's containerd image store (ids are manifest digests there)."""
    blob_store: Path | None = None
    """A :class:`nodekit.image.blobs.BlobStore` holding this image (``nodekit build`` wrote it), or None."""
    cached_layers: frozenset[str] = frozenset()
    """The diff ids whose layer files that store holds: a target that needs only these gets them from the store,
    without a ``docker save`` of the whole image."""
    identity: str = ""
    """What every store agrees this image is (:attr:`nodekit.system.docker.ImageInfo.identity`)."""
    ids: tuple[str, str] = ("", "")
    """The id a classic-store and a containerd-store engine give the image once loaded (config digest, manifest
    digest): known when nodekit wrote the image (``blob_store``); else ("", "")."""
    base_ref: str | None = None
    """An image on the source engine holding the layers below nodekit's own (the base), read with ``docker save``
    when a target lacks them; None when unknown."""

    @property
    def named(self) -> str:
        """The short id every command prints for this image: its identity (the same on either store)."""
        return short_id(self.identity or self.image_id)

    def id_on(self, containerd_store: bool) -> str:
        """The id this image has on an engine with that store; "" when unknown (an image nodekit did not write, on
        the other store: it is then recognized by its :attr:`identity` alone)."""
        if self.ids[0]:
            return self.ids[1] if containerd_store else self.ids[0]
        return self.image_id if containerd_store == self.containerd_store else ""

    def from_store(self, skip: frozenset[str]) -> bool:
        """Whether a target that has the layers ``skip`` can be sent the rest without a ``docker save`` of the
        whole image: from the blob store, and the base's layers from the base."""
        return self.blob_store is not None and all(
            layer.diff_id in self.cached_layers or layer.diff_id in skip or self.base_ref is not None
            for layer in self.layers
        )


@dataclass(frozen=True)
class Step:
    target: Target
    action: Action
    reason: str
    codec: Codec = "none"
    previous_id: str | None = None
    """The id ``ref`` named on the target before the push: restored there if verification fails."""
    layers: LayerPlan | None = None
    """For a load: which layers travel and which the target has (None: the whole image travels)."""
    image_id: str = ""
    """The id the image has (or will have) on the target's engine: it depends on that engine's image store."""


@dataclass(frozen=True)
class PushPlan:
    source: Source
    steps: tuple[Step, ...]

    def loads(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.action == "load")

    def to_text(self) -> str:
        src = self.source
        head = f"push {src.ref} ({src.named}, {size_text(src.size)}) from {src.endpoint or 'this engine'}"
        lines = [head]
        for s in self.steps:
            how = f" ({s.codec} stream)" if s.action == "load" else ""
            sends = f"; sends {s.layers.to_text()}" if s.layers is not None else ""
            lines.append(f"  {s.target.name:<24} {s.action}{how}: {s.reason}{sends}")
        return "\n".join(lines)


def short_id(image_id: str) -> str:
    """An image id as people read it: 12 hex digits, no ``sha256:``."""
    return image_id.removeprefix("sha256:")[:12]


def size_text(n: float) -> str:
    """A byte count in B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def codec_refusal(codec: Codec, st: TargetState, *, here_zstd: bool) -> str | None:
    """Why ``codec`` cannot be used toward ``st``, or None."""
    if codec != "zstd":
        return None
    if not here_zstd:
        return "this machine has no zstd command"
    if not st.target.endpoint.startswith("ssh://"):
        return f"{st.target.name} is not an ssh:// node: its engine would have to decompress zstd ({ZSTD_LOAD_CRASH})"
    if not st.zstd:
        return f"{st.target.name} has no zstd command to decompress it"
    return None


def plan_push(
    source: Source,
    states: Sequence[TargetState],
    *,
    compress: Compress = "auto",
    here_zstd: bool = False,
) -> PushPlan:
    """Decide each target's step. Raises ShipError, before anything moves, when a target cannot be asked or
    does not have room; UsageError when the same target is named twice."""
    seen: dict[str, str] = {}
    for st in states:
        if st.target.endpoint in seen:
            raise UsageError(f"target {st.target.endpoint} is named twice", fix="pass each --to once")
        seen[st.target.endpoint] = st.target.name
    broken = [st for st in states if st.error is not None]
    if broken:
        first = broken[0]
        more = (
            f" (and {len(broken) - 1} more: {', '.join(b.target.name for b in broken[1:])})" if len(broken) > 1 else ""
        )
        raise ShipError(
            f"cannot push to {first.target.name}: {first.error}{more}",
            fix=reach_fix(first.target.endpoint),
            node=first.target.name,
        )
    refused = [why for st in states if compress == "zstd" and (why := codec_refusal("zstd", st, here_zstd=here_zstd))]
    if refused:
        why = refused[0]
        raise UsageError(f"--compress zstd is refused: {why}", fix="apt-get install zstd there (or here), or "
                         "--compress gzip (or auto)")  # fmt: skip
    steps = []
    for st in states:
        t = st.target
        if same_engine(source, st):
            steps.append(Step(t, "skip", "is the source engine itself"))
        elif st.ref_id is not None and (
            st.ref_id == source.id_on(st.containerd_store)
            or (bool(source.identity) and st.ref_identity == source.identity)
        ):
            steps.append(Step(t, "skip", f"already has {source.named}"))
        elif st.has_image:
            steps.append(Step(t, "tag", "has the image under another name", previous_id=st.ref_id,
                              image_id=source.id_on(st.containerd_store)))  # fmt: skip
        else:
            layers = None
            if source.layers and st.chains is not None:
                layers = plan_layers(source.layers, st.chains)
            # The target keeps what it has; it needs room for what arrives (the archive, then the unpacked layers).
            incoming = travelling_bytes(source.size, layers)
            need = int(incoming * DISK_FACTOR)
            if st.free_bytes is not None and st.free_bytes < need:
                raise ShipError(
                    f"{t.name} has {size_text(st.free_bytes)} free for Docker, loading {source.ref} needs about "
                    f"{size_text(need)}",
                    fix=f"free space on {t.name} (docker system prune, or a larger disk for Docker's data root)",
                    node=t.name,
                )
            codec = choose_codec(compress, t.endpoint, target_zstd=st.zstd, here_zstd=here_zstd)
            reason = "has an older image under this name" if st.ref_id else "does not have the image"
            if source.engine_id and st.engine_id == source.engine_id:
                reason += f" (its engine ID is the source's, {source.engine_id}: {SHARED_ID})"
            if st.containerd_store != source.containerd_store:
                reason += " (it keeps images in the other image store: loaded as an archive both stores read)"
            steps.append(Step(t, "load", reason, codec=codec, previous_id=st.ref_id, layers=layers,
                              image_id=source.id_on(st.containerd_store)))  # fmt: skip
    return PushPlan(source=source, steps=tuple(steps))


SHARED_ID = "a cloned data root, or /etc/docker/key.json, which Docker >= 23 copies into every new data root"


def same_engine(source: Source, st: TargetState) -> bool:
    """Whether the target is the source engine itself (reached by another name). Never from the engine ID alone:
    two engines share one when a data root was cloned (VM images) or when /etc/docker/key.json existed as each
    was created (Docker >= 23 takes the ID from it). The source engine holds the image under the pushed name, so a
    target with the source's ID that does not is another engine, and is sent the image."""
    return bool(source.engine_id) and st.engine_id == source.engine_id and st.ref_id == source.image_id


def reach_fix(endpoint: str) -> str:
    """The fix to print when the engine at ``endpoint`` cannot be asked."""
    scheme = urlsplit(endpoint).scheme
    if scheme == "ssh":
        return f"check that `docker -H {endpoint} info` works (ssh key, and the user in the docker group there)"
    if scheme == "tcp":
        return f"check that the engine listens there (`docker -H {endpoint} info`) and the port is open"
    return f"start the Docker engine behind that socket (`docker -H {endpoint} info` must answer)"
