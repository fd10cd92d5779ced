"""Images on an engine: inspect (the engine's own JSON, so an image's identity is computed from exactly what it
reports), list, tag, remove, load an archive. The build's layers stream through :mod:`nodekit.system.docker.streams`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nodekit.errors import EngineError, ImageError
from nodekit.system.docker.calls import (
    ENGINE_FIX,
    LOAD_S,
    Engine,
    fails,
    inspect_listed,
    query,
    whales_loaded,
    where,
)
from nodekit.system.docker.models import ImageInfo, image_info_of


def image_info(ref: str, host: str | None = None) -> ImageInfo | None:
    """The image ``ref`` on ``host``, or None when that engine does not have it. Read from the engine's own JSON
    (python-on-whales runs the command; its model would retype fields), so :attr:`ImageInfo.identity` is computed
    from exactly what the engine reports, on either image store."""
    whales_loaded()
    from python_on_whales.exceptions import NoSuchImage
    from python_on_whales.utils import run

    e = Engine(host)
    cannot = f"cannot inspect image {ref} on {where(host)}"
    argv = [*e.docker.client_config.docker_cmd, "image", "inspect", "--format", "{{json .}}", ref]
    with e.calling(f"inspecting image {ref}", fails(EngineError, cannot, ENGINE_FIX), diagnose=True):
        try:
            out = run(argv)
        except NoSuchImage:
            return None
    return image_info_of(json.loads(str(out)))


def require_image(ref: str, host: str | None = None, *, node: str | None = None) -> ImageInfo:
    info = image_info(ref, host)
    if info is None:
        raise ImageError(
            f"image {ref} is not on {where(host)}",
            fix="nodekit build (on this node), or nodekit push from the node that built it",
            node=node,
        )
    return info


def images_labelled(label: str, value: str, host: str | None = None) -> list[ImageInfo]:
    """Images carrying ``label=value``, newest first. Two engine calls whatever their number (python-on-whales'
    list inspects each image separately: 60 calls and 1.5 s for 20 images, on the path of every ``nodekit up``)."""

    out = inspect_listed(host, ("--filter", f"label={label}={value}"), (), what="list images")
    found = json.loads(out) if out else []
    found.sort(key=lambda i: str(i.get("Created", "")), reverse=True)
    return [image_info_of(i) for i in found]


def tag_image(image: str, ref: str, host: str | None = None) -> None:
    e = Engine(host)
    cannot = f"cannot tag {image} as {ref} on {where(host)}"
    with e.calling(f"tagging {image}", fails(ImageError, cannot, ENGINE_FIX)):
        e.docker.image.tag(image, ref)


def image_layers(ref: str, host: str | None = None) -> tuple[str, ...]:
    """The image's layer digests (its rootfs diff ids), base first."""
    e = Engine(host)
    cannot = f"cannot inspect image {ref} on {where(host)}"
    with e.calling(f"inspecting image {ref}", fails(ImageError, cannot, "nodekit build")):
        img = e.docker.image.inspect(ref)
    return tuple(str(layer) for layer in (img.root_fs.layers or []))


def image_config(ref: str, host: str | None = None) -> dict[str, Any]:
    """What ``docker image inspect`` says of ``ref``: the runtime configuration (``Config``), ``Architecture``,
    ``Os``, ``Variant`` and ``RootFS`` as Docker spells them; the facts an image built on top of it starts from."""

    out = query(host, "image", "inspect", "--format", "{{json .}}", ref, what=f"inspect {ref}", error=ImageError,
                 fix="nodekit build")  # fmt: skip
    found: dict[str, Any] = json.loads(out)
    return found


def image_history(ref: str, host: str | None = None) -> tuple[tuple[str, str, int], ...]:
    """``(created by, comment, size in bytes)`` of every history entry of ``ref``, oldest first."""

    out = query(
        host, "image", "history", "--human=false", "--no-trunc", "--format", "{{json .}}", ref,
        what=f"read the history of {ref}", error=ImageError, fix="nodekit build",
    )  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return tuple(
        (str(r.get("CreatedBy", "")), str(r.get("Comment", "")), int(r["Size"]) if str(r.get("Size", "")).isdigit()
         else 0)
        for r in reversed(rows)
    )  # fmt: skip


def history_sizes(ref: str, host: str | None = None) -> tuple[int, ...]:
    """The size in bytes of every history entry of ``ref``, oldest first (0 for entries that made no layer)."""
    return tuple(size for _, _, size in image_history(ref, host))


def layer_lists(host: str | None = None) -> list[tuple[str, ...]]:
    """The diff ids (base first) of every image on ``host``'s engine, dangling ones included: what its layer
    store holds, for planning which layers a push must send. Two calls, whatever the number of images."""

    out = inspect_listed(host, ("--all",), ("--format", "{{json .RootFS.Layers}}"), what="list the images")
    return [tuple(json.loads(line) or ()) for line in out.splitlines() if line.strip()]


def remove_image(ref: str, host: str | None = None) -> None:
    """Remove the tag ``ref`` (layers other images share stay); a missing image is not an error."""
    e = Engine(host)
    cannot = f"cannot remove {ref} on {where(host)}"
    with e.calling(f"removing {ref}", fails(ImageError, cannot, f"docker rmi {ref}")):
        if e.docker.image.exists(ref):
            e.docker.image.remove(ref, prune=False)


def load_archive(archive: Path) -> None:
    """``docker load`` an image archive from a file (the base image nodekit writes itself)."""
    e = Engine(deadline=LOAD_S)
    failed = f"docker load of {archive} failed"
    with e.calling(f"docker load of {archive}", fails(ImageError, failed, "nodekit base")):
        e.docker.image.load(archive, quiet=True)
