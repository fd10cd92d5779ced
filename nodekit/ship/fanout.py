"""Carrying out a push plan: one ``docker save`` on the source, compressed once, fanned out to one ``docker load``
per target in parallel, then the image id on every target compared with the source's.

Only the layers a target lacks travel: the plan says per target which layer files to leave out
(:class:`~nodekit.ship.plan.LayerPlan`), and targets that lack the same layers share one filtered stream
(:class:`~nodekit.ship.layers.WithoutLayers`). :func:`push` executes a :class:`~nodekit.ship.plan.PushPlan` it is
handed and decides nothing itself: skips are reported, re-tags are applied and verified, loads are streamed. Every
target is attempted; afterwards ShipError names the first failed target. A target whose stream breaks is cut off
(its engine discards the partial load), and one whose image id does not match gets its old name back, so a failed
push leaves that target's existing images as they were.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from nodekit import docker
from nodekit.errors import NodekitError, ShipError
from nodekit.progress import Reporter
from nodekit.ship import outcome
from nodekit.ship.grouping import groups as _groups
from nodekit.ship.grouping import relay_candidates
from nodekit.ship.layers import WithoutLayers, from_store
from nodekit.ship.outcome import SafeReporter as _SafeReporter
from nodekit.ship.outcome import as_ship_error as _as_ship_error
from nodekit.ship.outcome import diagnose as _diagnose
from nodekit.ship.outcome import verify as _verify
from nodekit.ship.plan import Codec, PushPlan, Step, short_id, size_text, travelling_bytes
from nodekit.ship.relay import (
    Hop,
    RelayMode,
    RelaySink,
    hop_of,
    split_chains,
)
from nodekit.ship.relay import why_not_loaded as relay_failures
from nodekit.ship.stream import PROGRESS_EVERY_S, Counted, compressed

# A target that takes no data for this long has stopped reading (a hung engine, a frozen SSH connection): it is
# cut off so that the others, fed from the same stream, go on. Loads write steadily; a minute of nothing is a hang.
STALL_S = 60.0

Chain = list[tuple[Step, Hop]]
"""Targets that relay one stream, first to last, with how each is dialled from the one before it."""

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
    """Targets that got the image from another target (a relay chain), not from the head: name to that target."""


class _Sink(Protocol):
    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> object: ...

    def abort(self) -> None: ...


def push(
    plan: PushPlan,
    reporter: Reporter,
    *,
    on_progress: ProgressFn | None = None,
    open_source: Callable[[str, str | None], Iterable[bytes]] | None = None,
    open_sink: Callable[[str], _Sink] | None = None,
    stall_s: float | None = None,
    relay: RelayMode = "auto",
) -> PushResult:
    """Carry out ``plan``. Every target is attempted; afterwards, ShipError names the first failed target (and
    how many others failed) when any did. ``open_source``/``open_sink`` replace docker save/load in tests.
    ``relay``: targets over ``ssh://`` that take the same stream pass it on to each other (a relay chain, see
    :mod:`nodekit.ship.relay`), so the head sends it once: ``auto`` when at least ``RELAY_MIN_BYTES`` travel,
    ``always``, or ``never``."""
    rep = _SafeReporter(reporter)
    src = plan.source
    result = PushResult(plan=plan)
    for s in plan.steps:
        if s.action == "skip":
            rep.done(f"{s.target.name}: skipped, {s.reason}")
    for s in plan.steps:
        if s.action == "tag":
            t0 = time.monotonic()
            try:
                docker.tag_image(src.image_id, src.ref, s.target.endpoint)
                _verify(src, s)
            except NodekitError as e:
                result.failures[s.target.name] = _as_ship_error(e, s.target)
                continue
            result.seconds[s.target.name] = time.monotonic() - t0
            rep.done(f"{s.target.name}: tagged {src.ref} ({s.reason})")
    groups = _groups(plan.loads())
    stall = STALL_S if stall_s is None else stall_s
    for (codec, skip), steps in groups.items():
        layers = steps[0].layers
        what = layers.to_text() if layers is not None else size_text(src.size)
        travels = travelling_bytes(src.size, layers)
        chains = _relay_chains(steps, travels, relay, rep) if open_sink is None else []
        relayed = [c for chain in chains for c, _ in chain]
        direct = [s for s in steps if all(s is not c for c in relayed)]
        names = ", ".join(
            [s.target.name for s in direct]
            + [" -> ".join(c.target.name for c, _ in chain) + " (relayed)" for chain in chains]
        )
        # From the build's blob store when it holds every file that travels: no docker save of the whole image.
        cached = None if open_source is not None else from_store(src, skip)
        origin = ", from the build's blob store" if cached is not None else ""
        rep.step(f"pushing {src.ref} ({what}, {codec} stream{origin}) to {names}")
        _fan_out(plan, direct, codec, skip, rep, result, on_progress, open_source, open_sink, stall, cached,
                 chains=chains)  # fmt: skip
        missed = [c for c in relayed if c.target.name in result.failures]
        if missed:
            # A relay that did not deliver (a node died, a hop was refused): those targets get it from the head.
            why = "; ".join(f"{c.target.name}: {result.failures.pop(c.target.name).message}" for c in missed)
            rep.warn(f"the relay chain did not deliver to every node ({why}); sending to them from the head")
            again = None if open_source is not None else from_store(src, skip)
            _fan_out(plan, missed, codec, skip, rep, result, on_progress, open_source, open_sink, stall, again)
    if result.failures:
        (_, first), *rest = result.failures.items()
        if rest:
            first = ShipError(
                f"{first.message} (and {len(rest)} more failed: {', '.join(n for n, _ in rest)})",
                fix=first.fix,
                node=first.node,
            )
        raise first
    return result


def _relay_chains(steps: list[Step], travels: int, mode: RelayMode, rep: _SafeReporter) -> list[Chain]:
    """The chains of targets of one stream that relay it to each other (first to last; at most ``CHAIN_MAX``
    nodes each). Their hops log in with keys made for the push (nodekit.ship.hopkeys), never the user's."""
    ssh_steps = relay_candidates(steps, travels, mode)
    if not ssh_steps:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(ssh_steps))) as pool:
        hops = list(pool.map(lambda s: hop_of(s.target.name, s.target.endpoint), ssh_steps))
    chain = [(s, h) for s, h in zip(ssh_steps, hops, strict=True) if isinstance(h, Hop)]
    for s, h in zip(ssh_steps, hops, strict=True):
        if not isinstance(h, Hop):
            rep.detail(f"{s.target.name}: not in the relay chain ({h}); sent from the head")
    if len(chain) < 2:
        return []
    return [chain[r.start : r.stop] for r in split_chains(len(chain))]


_END = object()


def _fan_out(
    plan: PushPlan,
    steps: list[Step],
    codec: Codec,
    skip: frozenset[str],
    rep: _SafeReporter,
    result: PushResult,
    on_progress: ProgressFn | None,
    open_source: Callable[[str, str | None], Iterable[bytes]] | None,
    open_sink: Callable[[str], _Sink] | None,
    stall_s: float = STALL_S,
    cached: Iterable[bytes] | None = None,
    *,
    chains: list[Chain] | None = None,
) -> None:
    """One save, without the layer files in ``skip``, compressed once, into one bounded queue per target; a slow
    target slows the stream, a failed one is dropped from it. ``cached``: the archive already composed without
    those files (from the build's blob store), used instead of the save. ``chains``: each, targets that take the
    stream through one queue, relaying it from the first to the last (:class:`~nodekit.ship.relay.RelaySink`)."""
    src = plan.source
    by_head = {chain[0][0].target.name: chain for chain in chains or []}
    # One queue, one sink per head: every direct target, and each chain's first node.
    heads = steps + [chain[0][0] for chain in chains or []]
    total = max(travelling_bytes(src.size, heads[0].layers), 1)
    answer = outcome.answer_deadline(total)  # after the stream's end: each target's engine must have answered
    queues = {s.target.name: queue.Queue[object](maxsize=16) for s in heads}
    dead = {s.target.name: threading.Event() for s in heads}
    sinks: dict[str, _Sink] = {}
    started = time.monotonic()

    def fail(step: Step, err: ShipError) -> None:
        """``step`` failed; when it heads a chain, every node after it is left without the image too."""
        result.failures.setdefault(step.target.name, err)
        for after, _ in by_head.get(step.target.name, [])[1:]:
            result.failures.setdefault(
                after.target.name,
                ShipError(f"the relay through {step.target.name} was cut", node=after.target.name),
            )

    def open_one(step: Step) -> _Sink:
        chain = by_head.get(step.target.name)
        if chain is not None:
            return RelaySink([h for _, h in chain])
        return (open_sink or docker.LoadSink)(step.target.endpoint)

    def loaded(step: Step, upstream: str | None) -> None:
        name = step.target.name
        result.seconds[name] = time.monotonic() - started
        result.layers_skipped[name] = skipped_n[0]
        spared = f", {skipped_n[0]} layers already there" if skipped_n[0] else ""
        how = f"relayed by {upstream}" if upstream else f"{size_text(result.sent.get(name, 0))} sent"
        if upstream:
            result.relayed[name] = upstream
        rep.done(f"{name}: loaded {src.ref} ({short_id(src.image_id)}) in {result.seconds[name]:.1f} s: {how}{spared}")

    def settle_chain(sink: _Sink, chain: Chain) -> None:
        """The chain ended: each node's own report, then its image id checked from here. Each node fails alone:
        the stream went on past a node whose own load failed (tee -p), so the nodes after it are judged by theirs.
        """
        assert isinstance(sink, RelaySink)
        with outcome.answered_within(sink, answer) as late:
            report = sink.finish()
        why = relay_failures([h for _, h in chain], report, sink.rc)
        relayed = [c for c, _ in chain]
        for i, step in enumerate(relayed):
            name = step.target.name
            if name in why:
                silent = late.is_set() and name not in report.loads  # its load never said how it ended
                result.failures.setdefault(
                    name,
                    outcome.no_answer(name, step.target.endpoint, answer)
                    if silent
                    else ShipError(f"{name} did not load the relayed stream: {why[name]}", node=name),
                )
                continue
            try:
                _verify(src, step)
            except NodekitError as e:
                result.failures.setdefault(name, _as_ship_error(e, step.target))
                continue
            loaded(step, relayed[i - 1].target.name if i else None)

    def consume(step: Step) -> None:
        name = step.target.name
        q = queues[name]
        last = 0.0
        try:
            sink = open_one(step)
            sinks[name] = sink
        except NodekitError as e:
            fail(step, _as_ship_error(e, step.target))
            dead[name].set()
            return
        try:
            while True:
                item = q.get()
                if item is _END:
                    break
                if isinstance(item, ShipError):
                    # The source broke: cut this load off so the engine discards the partial image.
                    sink.abort()
                    fail(step, ShipError(item.message, fix=item.fix, node=name))
                    dead[name].set()
                    return
                assert isinstance(item, tuple)
                chunk, sent = item
                sink.write(chunk)
                result.sent[name] = result.sent.get(name, 0) + len(chunk)
                now = time.monotonic()
                if on_progress is not None:
                    on_progress(name, sent, total)
                elif now - last >= PROGRESS_EVERY_S:
                    last = now
                    rate = result.sent[name] / max(now - started, 1e-6)
                    rep.detail(
                        f"{name}: {size_text(sent)} of {size_text(total)} ({100 * sent // total}%), "
                        f"{size_text(result.sent[name])} on the wire, {size_text(rate)}/s"
                    )
            if name in by_head:
                settle_chain(sink, by_head[name])
                return
            with outcome.answered_within(sink, answer) as late:
                try:
                    sink.finish()
                except NodekitError:
                    if not late.is_set():
                        raise
            if late.is_set():
                raise outcome.no_answer(name, step.target.endpoint, answer)
            _verify(src, step)
        except NodekitError as e:
            sink.abort()
            fail(step, _diagnose(e, step, plan))
            dead[name].set()
            return
        except BaseException as e:
            sink.abort()
            fail(
                step,
                ShipError(
                    f"pushing to {name} failed: {e}", fix=f"nodekit push again (--to {step.target.endpoint})", node=name
                ),
            )
            dead[name].set()
            return
        loaded(step, None)

    def put(name: str, item: object) -> None:
        waited_since = time.monotonic()
        while not dead[name].is_set():
            try:
                queues[name].put(item, timeout=min(0.5, stall_s))
                return
            except queue.Full:
                if time.monotonic() - waited_since >= stall_s:
                    stalled(name)
                continue

    def stalled(name: str) -> None:
        step = next(s for s in heads if s.target.name == name)
        fail(
            step,
            ShipError(
                f"{name} stopped reading the image stream: nothing taken for {stall_s:g} s; cut off, the other "
                "targets go on",
                fix=f"check the engine and the connection on {name} ({step.target.endpoint}), then nodekit push again",
                node=name,
            ),
        )
        dead[name].set()
        sink = sinks.get(name)
        if sink is not None:
            sink.abort()  # ends the load process, which unblocks the worker's write

    workers = [threading.Thread(target=consume, args=(s,), name=f"push-{s.target.name}", daemon=True) for s in heads]
    for w in workers:
        w.start()
    raw: Iterable[bytes] | None = None
    skipped_n = [0]
    try:
        raw = cached if cached is not None else (open_source or docker.SaveStream)(src.ref, src.endpoint)
        filtered = WithoutLayers(raw, skip) if skip and cached is None else None
        counted = Counted(filtered if filtered is not None else raw)
        for chunk in compressed(counted, codec):
            live = [s.target.name for s in heads if not dead[s.target.name].is_set()]
            if not live:
                break
            for name in live:
                put(name, (chunk, min(counted.n, total)))
        if filtered is not None:
            skipped_n[0] = len(filtered.skipped)
        elif cached is not None:
            skipped_n[0] = len(skip)
        for s in heads:
            put(s.target.name, _END)
    except BaseException as e:
        err = e if isinstance(e, NodekitError) else ShipError(f"the image stream from the source broke: {e}")
        failure = ShipError(
            f"{err.message}; nothing was loaded on the targets",
            fix=f"check the image on the source ({src.endpoint or 'this engine'}: docker image inspect {src.ref}), "
            "then nodekit push again",
        )
        for s in heads:
            put(s.target.name, failure)
        if not isinstance(e, Exception):
            raise
    finally:
        for w in workers:
            # A cut-off target's worker may still sit in a write its sink cannot interrupt; it is a daemon.
            w.join(timeout=None if not dead[w.name.removeprefix("push-")].is_set() else 5)
        close = getattr(raw, "close", None)
        if callable(close):
            close()
