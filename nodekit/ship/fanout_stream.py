"""One stream of a push: one save (or the archive from the build's blob store), compressed once, fanned out to
the targets that take it, each through its own bounded queue and worker thread. :func:`nodekit.ship.fanout.push`
runs one :class:`FanOut` per stream it decides on; this module carries a stream out and decides nothing else.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from nodekit.errors import NodekitError, ShipError
from nodekit.ship import outcome
from nodekit.ship.codecs import Codec
from nodekit.ship.hopkeys import Hop
from nodekit.ship.layers import WithoutLayers
from nodekit.ship.outcome import ProgressFn, PushResult
from nodekit.ship.outcome import SafeReporter as _SafeReporter
from nodekit.ship.outcome import as_ship_error as _as_ship_error
from nodekit.ship.outcome import diagnose as _diagnose
from nodekit.ship.plan import PushPlan, Source, Step, size_text, travelling_bytes
from nodekit.ship.relay import RelaySink
from nodekit.ship.relay import why_not_loaded as relay_failures
from nodekit.ship.stream import PROGRESS_EVERY_S, Counted, compressed, unzstd_sink
from nodekit.ship.tree import cut_off
from nodekit.system import docker

Relayed = list[tuple[Step, Hop]]
"""Targets that relay one stream to each other, with how each is dialled: the relay tree over them is
:func:`~nodekit.ship.tree.plan_tree` of their number (index 0, the root, is fed by the head)."""


class Sink(Protocol):
    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> object: ...

    def abort(self) -> None: ...


_END = object()


class FanOut:
    """One save, without the layer files in ``skip``, compressed once, into one bounded queue per target; a slow
    target slows the stream, a failed one is dropped from it. ``trees``: each, targets that take the stream through
    one queue, relaying it down a tree from the first (:class:`~nodekit.ship.relay.RelaySink`).

    One instance carries one stream: :meth:`run` feeds it from this thread, one daemon worker per head
    (:meth:`consume`) writes it into that head's sink. Workers record into ``result``; a target's failure is
    recorded once, the first cause kept."""

    def __init__(
        self,
        plan: PushPlan,
        steps: list[Step],
        codec: Codec,
        skip: frozenset[str],
        rep: _SafeReporter,
        result: PushResult,
        on_progress: ProgressFn | None,
        open_source: Callable[[str, str | None], Iterable[bytes]] | None,
        open_sink: Callable[[str], Sink] | None,
        stall_s: float,
        verify: Callable[[Source, Step], None],
        *,
        trees: list[Relayed] | None = None,
    ) -> None:
        self.plan, self.src, self.codec, self.skip = plan, plan.source, codec, skip
        self.rep, self.result, self.on_progress = rep, result, on_progress
        self.open_source, self.open_sink, self.stall_s, self.verify = open_source, open_sink, stall_s, verify
        self.by_head = {chain[0][0].target.name: chain for chain in trees or []}
        # One queue, one sink per head: every direct target, and each tree's root.
        self.heads = steps + [chain[0][0] for chain in trees or []]
        self.total = max(travelling_bytes(self.src.size, self.heads[0].layers), 1)
        # After the stream's end: each target's engine must have answered.
        self.answer = outcome.answer_deadline(self.total)
        self.queues = {s.target.name: queue.Queue[object](maxsize=16) for s in self.heads}
        self.dead = {s.target.name: threading.Event() for s in self.heads}
        self.sinks: dict[str, Sink] = {}
        # The cleanups a cut tree left running on its nodes (RelaySink.settle): awaited by settle(), after the push.
        self.settles: list[Callable[[], None]] = []
        self.started = time.monotonic()
        # Layer files left out of the stream; set once it ended, before _END, so a worker reads it in loaded().
        self.skipped_n = 0

    def run(self, cached: Iterable[bytes] | None = None) -> None:
        """Stream to every head and wait for their workers. ``cached``: the archive already composed without the
        files in ``skip`` (from the build's blob store), used instead of the save."""
        workers = [
            threading.Thread(target=self.consume, args=(s,), name=f"push-{s.target.name}", daemon=True)
            for s in self.heads
        ]
        for w in workers:
            w.start()
        raw: Iterable[bytes] | None = None
        try:
            save = self.open_source or docker.SaveStream
            raw = cached if cached is not None else save(self.src.ref, self.src.endpoint)
            self.feed(raw, composed=cached is not None)
        except BaseException as e:
            err = e if isinstance(e, NodekitError) else ShipError(f"the image stream from the source broke: {e}")
            failure = ShipError(
                f"{err.message}; nothing was loaded on the targets",
                fix=f"check the image on the source ({self.src.endpoint or 'this engine'}: docker image inspect "
                f"{self.src.ref}), then nodekit push again",
            )
            for s in self.heads:
                self.put(s.target.name, failure)
            if not isinstance(e, Exception):
                raise
        finally:
            for w in workers:
                # A cut-off target's worker may still sit in a write its sink cannot interrupt; it is a daemon.
                w.join(timeout=None if not self.dead[w.name.removeprefix("push-")].is_set() else 5)
            close = getattr(raw, "close", None)
            if callable(close):
                close()

    def feed(self, raw: Iterable[bytes], *, composed: bool) -> None:
        """``raw`` (the save, or with ``composed`` the archive from the blob store, already without the skipped
        files) compressed once into every live head's queue, then the end of the stream."""
        filtered = WithoutLayers(raw, self.skip) if self.skip and not composed else None
        counted = Counted(filtered if filtered is not None else raw)
        for chunk in compressed(counted, self.codec):
            live = [s.target.name for s in self.heads if not self.dead[s.target.name].is_set()]
            if not live:
                break
            for name in live:
                self.put(name, (chunk, min(counted.n, self.total)))
        if filtered is not None:
            self.skipped_n = len(filtered.skipped)
        elif composed:
            self.skipped_n = len(self.skip)
        for s in self.heads:
            self.put(s.target.name, _END)

    def put(self, name: str, item: object) -> None:
        """``item`` into ``name``'s queue; a direct target whose queue stays full for ``stall_s`` is cut off. A
        tree's queue is drained into its :class:`~nodekit.ship.relay.RelaySink`, whose own stall deadline (the same
        ``stall_s``) cuts the tree on every node: one deadline, not two racing for it."""
        waited_since = time.monotonic()
        while not self.dead[name].is_set():
            try:
                self.queues[name].put(item, timeout=min(0.5, self.stall_s))
                return
            except queue.Full:
                if name not in self.by_head and time.monotonic() - waited_since >= self.stall_s:
                    self.stalled(name)
                continue

    def stalled(self, name: str) -> None:
        step = next(s for s in self.heads if s.target.name == name)
        self.fail(
            step,
            ShipError(
                f"{name} stopped reading the image stream: nothing taken for {self.stall_s:g} s; cut off, the other "
                "targets go on",
                fix=f"check the engine and the connection on {name} ({step.target.endpoint}), then nodekit push again",
                node=name,
            ),
        )
        self.dead[name].set()
        sink = self.sinks.get(name)
        if sink is not None:
            sink.abort()  # ends the load process, which unblocks the worker's write

    def consume(self, step: Step) -> None:
        """The worker of one head: its queue into its sink, then its outcome (a tree's: every node's)."""
        name = step.target.name
        try:
            sink = self.open_one(step)
            self.sinks[name] = sink
        except NodekitError as e:
            self.fail(step, _as_ship_error(e, step.target))
            self.dead[name].set()
            return
        try:
            if not self.drain(step, sink):
                return
            if name in self.by_head:
                self.settle_tree(sink, self.by_head[name])
                return
            self.settle_direct(step, sink)
        except NodekitError as e:
            self.cut_sink(sink)
            self.fail(step, _diagnose(e, step, self.plan))
            self.dead[name].set()
            return
        except BaseException as e:
            self.cut_sink(sink)
            self.fail(
                step,
                ShipError(
                    f"pushing to {name} failed: {e}", fix=f"nodekit push again (--to {step.target.endpoint})", node=name
                ),
            )
            self.dead[name].set()
            return
        self.loaded(step, None)

    def drain(self, step: Step, sink: Sink) -> bool:
        """Write the head's queue into ``sink`` up to the stream's end (True), or until the source broke (False:
        the load was cut off and the failure recorded)."""
        name = step.target.name
        q = self.queues[name]
        last = 0.0
        while True:
            item = q.get()
            if item is _END:
                return True
            if isinstance(item, ShipError):
                # The source broke: cut this load off so the engine discards the partial image.
                self.cut_sink(sink)
                self.fail(step, ShipError(item.message, fix=item.fix, node=name))
                self.dead[name].set()
                return False
            assert isinstance(item, tuple)
            chunk, sent = item
            sink.write(chunk)
            self.result.sent[name] = self.result.sent.get(name, 0) + len(chunk)
            now = time.monotonic()
            if self.on_progress is not None:
                self.on_progress(name, sent, self.total)
            elif now - last >= PROGRESS_EVERY_S:
                last = now
                rate = self.result.sent[name] / max(now - self.started, 1e-6)
                self.rep.detail(
                    f"{name}: {size_text(sent)} of {size_text(self.total)} ({100 * sent // self.total}%), "
                    f"{size_text(self.result.sent[name])} on the wire, {size_text(rate)}/s"
                )

    def cut_sink(self, sink: Sink) -> None:
        """Abort ``sink``. A relay tree's cleanup on its nodes (ending each node's relay step, which waits out its
        deadline on a node that does not answer) runs on while this stream's other targets and the re-feed of the
        nodes it cut off go on; :meth:`settle` waits for it."""
        if isinstance(sink, RelaySink):
            sink.abort(wait=False)
            self.settles.append(sink.settle)
        else:
            sink.abort()

    def settle(self) -> None:
        """Wait for the cleanups that cut trees left running (:meth:`cut_sink`)."""
        for settle in self.settles:
            settle()

    def settle_direct(self, step: Step, sink: Sink) -> None:
        """The stream ended on a direct target: its engine's answer within the deadline, then its image id."""
        with outcome.answered_within(sink, self.answer) as late:
            try:
                sink.finish()
            except NodekitError:
                if not late.is_set():
                    raise
        if late.is_set():
            raise outcome.no_answer(step.target.name, step.target.endpoint, self.answer)
        self.verify(self.src, step)

    def settle_tree(self, sink: Sink, chain: Relayed) -> None:
        """The tree ended: each node's own report, then its image id checked from here. Each node fails alone:
        the stream went on past a node whose own load failed (tee -p), so the nodes below it are judged by theirs;
        a node the stream did not reach because one above it failed is named as cut off by that one."""
        assert isinstance(sink, RelaySink)
        with outcome.answered_within(sink, self.answer) as late:
            report = sink.finish()
        tree = sink.tree
        why = relay_failures([h for _, h in chain], report, sink.rc, tree)
        relayed = [c for c, _ in chain]
        unreached = [i for i, c in enumerate(relayed) if c.target.name in why and c.target.name not in report.loads]
        cut = cut_off(tree, unreached)
        for i, step in enumerate(relayed):
            name = step.target.name
            if i in cut:
                self.cut(step, relayed[cut[i]].target.name)
                continue
            if name in why:
                silent = late.is_set() and name not in report.loads  # its load never said how it ended
                self.result.failures.setdefault(
                    name,
                    outcome.no_answer(name, step.target.endpoint, self.answer)
                    if silent
                    else ShipError(f"{name} did not load the relayed stream: {why[name]}", node=name),
                )
                continue
            try:
                self.verify(self.src, step)
            except NodekitError as e:
                self.result.failures.setdefault(name, _as_ship_error(e, step.target))
                continue
            p = tree.parent[i]
            self.loaded(step, relayed[p].target.name if p is not None else None)

    def cut(self, step: Step, above: str) -> None:
        """``step`` was not reached: the relay through ``above``, higher in its tree, failed."""
        name = step.target.name
        self.result.failures.setdefault(name, ShipError(f"the relay through {above} was cut", node=name))
        self.result.cut_by.setdefault(name, above)

    def loaded(self, step: Step, upstream: str | None) -> None:
        name, src, result = step.target.name, self.src, self.result
        result.seconds[name] = time.monotonic() - self.started
        result.layers_skipped[name] = self.skipped_n
        spared = f", {self.skipped_n} layers already there" if self.skipped_n else ""
        how = f"relayed by {upstream}" if upstream else f"{size_text(result.sent.get(name, 0))} sent"
        if upstream:
            result.relayed[name] = upstream
        self.rep.done(f"{name}: loaded {src.ref} ({src.named}) in {result.seconds[name]:.1f} s: {how}{spared}")

    def fail(self, step: Step, err: ShipError) -> None:
        """``step`` failed; when it is a tree's root, every other node of the tree is left without the image too."""
        self.result.failures.setdefault(step.target.name, err)
        for after, _ in self.by_head.get(step.target.name, [])[1:]:
            self.cut(after, step.target.name)

    def open_one(self, step: Step) -> Sink:
        chain = self.by_head.get(step.target.name)
        if chain is not None:
            return RelaySink([h for _, h in chain], codec=self.codec, stall_s=self.stall_s)
        if self.open_sink is not None:
            return self.open_sink(step.target.endpoint)
        if self.codec == "zstd":
            return unzstd_sink(step.target.endpoint)
        return docker.LoadSink(step.target.endpoint)
