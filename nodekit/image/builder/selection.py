"""Which image ``nodekit up`` runs when none is named: :func:`choose` and :func:`current_image`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image.builder.planning import project_fingerprint
from nodekit.image.builder.record import last_build
from nodekit.image.builder.staleness import changes, current_inputs, recorded_inputs
from nodekit.image.plan import LABEL_FINGERPRINT, LABEL_NAME
from nodekit.system import docker

BUILD_FIX = "nodekit build"


class Choice(NamedTuple):
    ref: str
    why: str
    id: str  # the image's identity (ImageInfo.identity), the id every command names it by on either store


def choose(settings: Settings, *, cached_only: bool = False) -> Choice:
    """The image ``nodekit up`` runs when none is named, why, and its id. Deterministic:

    1. the image whose fingerprint is the project's as it is now on this node (built here or pushed here);
    2. else, when a build record names an image that is here, that image is stale (the project changed since):
       ImageError with the fix (``nodekit build``, ``nodekit up --build``, or ``--image`` to run it anyway);
    3. else, when the project's fingerprint cannot be known here (no lock, no base image: a node that only
       received a pushed image), the one image of this project here; several: ImageError asking for ``--image``.

    Creation time never decides: every nodekit image has the same reproducible one. ``cached_only`` (dry runs):
    the base is not probed when this machine has not probed it before (see :func:`project_fingerprint`).
    """
    name = settings.image_name
    # Two engine calls that need nothing of each other's, on the path of every `nodekit up` and `run`: the project's
    # images are listed while the fingerprint's base is inspected (and probed when this machine never probed it).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nodekit-images") as pool:
        listed = pool.submit(docker.images_labelled, LABEL_NAME, name)
        fingerprint, unknown = project_fingerprint(settings, cached_only=cached_only)
        labelled = listed.result()

    def ref(info: docker.ImageInfo) -> str:
        tags = sorted(t for t in info.tags if t.startswith(f"nodekit/{name}:"))
        return tags[0] if tags else info.id

    if fingerprint is not None:
        match = [i for i in labelled if i.labels.get(LABEL_FINGERPRINT) == fingerprint]
        # Two images can carry one fingerprint (a rebuild after the engine's build cache was pruned is not always
        # the same image id): the tagged one is the project's current image, an untagged one a leftover.
        match.sort(key=lambda i: ref(i) == i.id)
        if match:
            return Choice(
                ref(match[0]), f"its fingerprint {fingerprint[:12]} is the project's as it is now", match[0].identity
            )
    record = last_build(settings)
    recorded = record.get("tag") if record else None
    found = docker.image_info(recorded) if isinstance(recorded, str) else None
    if isinstance(recorded, str) and found is not None:
        # Named the same way on every host: the record's inputs against the project's code and lock as they are
        # now, which need no base image (a node that only received a pushed image has none).
        old, now = recorded_inputs(record), current_inputs(settings)
        what = changes(old, now) if old is not None and now is not None else []
        if fingerprint is not None or what:
            since = ", ".join(what) if what else f"its fingerprint is now {fingerprint[:12] if fingerprint else '?'}"
            raise ImageError(
                f"the image built here last, {recorded}, no longer matches the project: {since}",
                fix=f"nodekit build (or nodekit run --build, nodekit up --build); or --image {recorded} to run the old "
                "image anyway",
            )
        return Choice(
            recorded, f"the last build here (the project's fingerprint is unknown: {unknown})", found.identity
        )
    if fingerprint is not None:
        raise ImageError(
            f"no image of {name} here matches the project (fingerprint {fingerprint[:12]})",
            fix=f"{BUILD_FIX}, or nodekit push it from the node that built it, or pass --image",
        )
    refs = sorted({ref(i) for i in labelled})
    if len(refs) == 1:
        why = f"the only image of {name} here (the project's fingerprint is unknown: {unknown})"
        return Choice(refs[0], why, labelled[0].identity)
    if not refs:
        raise ImageError(f"no image built yet for {name}", fix=BUILD_FIX)
    raise ImageError(
        f"{len(refs)} images of {name} are here ({', '.join(refs[:3])}) and the project's fingerprint, which would "
        f"pick one, is unknown ({unknown})",
        fix="pass --image with the one to run (the one pushed from the node that built it)",
    )


def current_image(settings: Settings) -> str:
    """The image to run when none is named (see :func:`choose`). Raises ImageError with the fix."""
    return choose(settings).ref
