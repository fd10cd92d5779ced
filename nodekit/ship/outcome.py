"""What became of each target of a push: its image id checked against the source's, a failed load read for its
cause, and the deadline on a target's answer once the whole stream reached it. Used by :mod:`nodekit.ship.fanout`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from nodekit.errors import NodekitError, ShipError
from nodekit.ship.plan import PushPlan, Source, Step, Target, reach_fix, short_id, size_text
from nodekit.ship.stream import diagnose_load_failure
from nodekit.system import docker
from nodekit.system.progress import Reporter

ANSWER_S = 120.0
"""After the last byte of the stream, a target's engine must say what it loaded within this, plus the time to
register what arrived at :data:`ANSWER_BYTES_PER_S`. A target that took every byte and never answers (a wedged
dockerd, a relay node whose load hung) is cut off then, and named. Read from this module at every push."""
ANSWER_BYTES_PER_S = 50 << 20
"""How fast an engine is assumed to register an image it received (unpacking layers onto a slow disk): 10 GiB adds
about 200 s to :data:`ANSWER_S`."""


ProgressFn = Callable[[str, int, int], None]
"""``(target name, bytes of the image sent, bytes in all)``; called from worker threads."""


@dataclass
class PushResult:
    plan: PushPlan
    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, ShipError] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    """Bytes written into each target's ``docker load`` (after compression: what went on the wire)."""
    layers_skipped: dict[str, int] = field(default_factory=dict)
    """How many of the image's layer files each target was spared (it had them)."""
    relayed: dict[str, str] = field(default_factory=dict)
    """Targets that got the image from another target (a relay tree), not from the head: name to that target."""
    cut_by: dict[str, str] = field(default_factory=dict)
    """Targets the relay tree did not reach because a node above them failed: name to that node."""
    refed: list[str] = field(default_factory=list)
    """Targets the relay tree did not deliver to, sent the image from the head afterwards."""


def answer_deadline(image_bytes: int) -> float:
    """Seconds a target has, after the stream's end, to answer for ``image_bytes`` of image (uncompressed)."""
    return ANSWER_S + image_bytes / ANSWER_BYTES_PER_S


class Abortable(Protocol):
    def abort(self) -> None: ...


@contextlib.contextmanager
def answered_within(sink: Abortable, seconds: float) -> Iterator[threading.Event]:
    """Around a sink's ``finish``: when it has not returned within ``seconds``, the sink is aborted (its load
    process, or the relay's session and processes, ended), which makes ``finish`` return or raise. Yields an Event
    that is set when that happened, so the caller names the silence instead of the abort's own error."""
    late = threading.Event()

    def expire() -> None:
        late.set()
        sink.abort()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield late
    finally:
        timer.cancel()


def no_answer(name: str, endpoint: str, seconds: float) -> ShipError:
    return ShipError(
        f"{name} took the whole image stream but did not answer within {seconds:.0f} s of its end; cut off (its "
        "engine discards a load that never completed)",
        fix=f"check the engine on {name} (docker -H {endpoint} info; restart dockerd if it does not answer), then "
        "nodekit push again",
        node=name,
    )


class SafeReporter:
    """Reporters are not thread-safe (rich's live line is not); workers report through this lock."""

    def __init__(self, reporter: Reporter) -> None:
        self._r = reporter
        self._lock = threading.Lock()

    def _locked(self, say: Callable[[str], None], text: str) -> None:
        with self._lock:
            say(text)

    def step(self, message: str) -> None:
        self._locked(self._r.step, message)

    def detail(self, line: str) -> None:
        self._locked(self._r.detail, line)

    def done(self, message: str) -> None:
        self._locked(self._r.done, message)

    def warn(self, message: str) -> None:
        self._locked(self._r.warn, message)


def as_ship_error(e: NodekitError, target: Target) -> ShipError:
    if isinstance(e, ShipError) and e.node:
        return e
    return ShipError(e.message, fix=e.fix or reach_fix(target.endpoint), node=target.name)


def verify(src: Source, step: Step) -> None:
    """The image ``ref`` names on the target must be the source's: the id that target's store gives it, and the
    same identity (layers and configuration, as both stores report them); else the old name is put back."""
    got = docker.image_info(src.ref, step.target.endpoint)
    want = step.image_id
    if (
        got is not None
        and (not want or got.id == want)
        and (want or src.identity)
        and (not src.identity or got.identity == src.identity)
    ):
        return
    if step.previous_id is not None:
        docker.tag_image(step.previous_id, src.ref, step.target.endpoint)
    found = short_id(got.id) if got else "nothing"
    raise ShipError(
        f"after loading, {src.ref} on {step.target.name} is {found}, not {short_id(want or src.image_id)} as it "
        "must be",
        fix=f"nodekit push again; if it repeats, compare `docker image inspect {src.ref}` on both engines",
        node=step.target.name,
    )


def diagnose(e: NodekitError, step: Step, plan: PushPlan) -> ShipError:
    """A failed load, named by its cause (unreachable, a layer gone, a full disk, a corrupt stream)."""
    name, src = step.target.name, plan.source
    if isinstance(e, ShipError) and e.node:
        return e
    kind = diagnose_load_failure(e.message)
    if kind == "unreachable":
        return ShipError(
            f"cannot reach the Docker engine on {name} ({step.target.endpoint}): {e.message}",
            fix=reach_fix(step.target.endpoint),
            node=name,
        )
    if kind == "missing layer":
        # A layer left out because the survey found it there was gone by the time docker load looked for it.
        return ShipError(
            f"{name} no longer has a layer it had when asked (an image removed during the push?); nothing was "
            f"loaded: {e.message}",
            fix=f"nodekit push again (--to {step.target.endpoint}): it asks again what {name} has",
            node=name,
        )
    if kind == "disk":
        return ShipError(
            f"{name} ran out of disk space loading {src.ref} ({size_text(src.size)}): {e.message}",
            fix=f"free space on {name} (docker system prune there); its existing images are untouched",
            node=name,
        )
    if kind == "corrupt":
        return ShipError(
            f"the image stream reached {name} corrupted or cut short; {name} discarded it: {e.message}",
            fix=f"nodekit push again (--to {step.target.endpoint}); if it repeats, check the network to {name}",
            node=name,
        )
    return ShipError(e.message, fix=e.fix or f"nodekit push again (--to {step.target.endpoint})", node=name)
