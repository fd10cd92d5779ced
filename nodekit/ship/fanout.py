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

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from nodekit.errors import NodekitError, ShipError
from nodekit.ship.dial import hop_of
from nodekit.ship.fanout_stream import FanOut, Relayed, Sink
from nodekit.ship.grouping import groups as _groups
from nodekit.ship.grouping import relay_candidates
from nodekit.ship.hopkeys import Hop
from nodekit.ship.layers import from_store
from nodekit.ship.outcome import ProgressFn, PushResult
from nodekit.ship.outcome import SafeReporter as _SafeReporter
from nodekit.ship.outcome import as_ship_error as _as_ship_error
from nodekit.ship.outcome import verify as _verify
from nodekit.ship.plan import PushPlan, Step, size_text, travelling_bytes
from nodekit.ship.relay import STALL_S as RELAY_STALL_S
from nodekit.ship.relay import RelayMode
from nodekit.ship.tree import plan_tree
from nodekit.system import docker
from nodekit.system.progress import Reporter

# A target that takes no data for this long has stopped reading (a hung engine, a frozen SSH connection): it is
# cut off so that the others, fed from the same stream, go on. Loads write steadily; a minute of nothing is a hang.
# A relay tree's is the same deadline, kept by its sink (nodekit.ship.relay.STALL_S), for images and datasets alike.
STALL_S = RELAY_STALL_S


def push(
    plan: PushPlan,
    reporter: Reporter,
    *,
    on_progress: ProgressFn | None = None,
    open_source: Callable[[str, str | None], Iterable[bytes]] | None = None,
    open_sink: Callable[[str], Sink] | None = None,
    stall_s: float | None = None,
    relay: RelayMode = "auto",
) -> PushResult:
    """Carry out ``plan``. Every target is attempted; afterwards, ShipError names the first failed target (and
    how many others failed) when any did. ``open_source``/``open_sink`` replace docker save/load in tests.
    ``relay``: targets over ``ssh://`` that take the same stream pass it on to each other (a relay tree, see
    :mod:`nodekit.ship.relay` and :mod:`nodekit.ship.tree`), so the head sends it once: ``auto`` when at least
    ``RELAY_MIN_BYTES`` travel, ``always``, or ``never``."""
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
                docker.tag_image(s.image_id, src.ref, s.target.endpoint)
                _verify(src, s)
            except NodekitError as e:
                result.failures[s.target.name] = _as_ship_error(e, s.target)
                continue
            result.seconds[s.target.name] = time.monotonic() - t0
            rep.done(f"{s.target.name}: tagged {src.ref} ({s.reason})")
    groups = _groups(plan.loads())
    stall = STALL_S if stall_s is None else stall_s
    fans: list[FanOut] = []  # each stream's, whose cut trees' cleanups the push waits for before it ends
    try:
        for (codec, skip), steps in groups.items():
            layers = steps[0].layers
            what = layers.to_text() if layers is not None else size_text(src.size)
            travels = travelling_bytes(src.size, layers)
            trees = _relay_trees(steps, travels, relay, rep) if open_sink is None else []
            relayed = [c for chain in trees for c, _ in chain]
            direct = [s for s in steps if all(s is not c for c in relayed)]
            names = ", ".join([s.target.name for s in direct] + [_tree_text(chain) for chain in trees])
            # From the build's blob store when it holds every file that travels: no docker save of the whole image.
            cached = None if open_source is not None else from_store(src, skip)
            origin = ", from the build's blob store" if cached is not None else ""
            rep.step(f"pushing {src.ref} ({what}, {codec} stream{origin}) to {names}")
            # At most three rounds: the tree; then what it did not deliver, the nodes cut off below a failed one in a
            # new tree of their own (so a failure high in a big tree costs the head one more copy, not one per node)
            # and the failed ones directly; then directly, whatever that new tree did not deliver.
            for again in (True, False, False):
                fan = FanOut(plan, direct, codec, skip, rep, result, on_progress, open_source, open_sink, stall,
                             _verify, trees=trees)  # fmt: skip
                fans.append(fan)
                fan.run(cached)
                missed = [c for chain in trees for c, _ in chain if c.target.name in result.failures]
                if not missed:
                    break
                cut = [c for c in missed if c.target.name in result.cut_by]
                trees = _relay_trees(cut, travels, relay, rep) if again and open_sink is None else []
                anew = [c for chain in trees for c, _ in chain]
                direct = [c for c in missed if all(c is not a for a in anew)]
                rep.warn(_missed_text(missed, result, [c.target.name for c in direct], [c.target.name for c in anew]))
                for c in missed:
                    del result.failures[c.target.name]
                    result.cut_by.pop(c.target.name, None)
                result.refed += [c.target.name for c in missed]
                cached = None if open_source is not None else from_store(src, skip)
    finally:
        for fan in fans:
            fan.settle()
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


def _tree_text(chain: Relayed) -> str:
    tree = plan_tree(len(chain))
    fed = "; ".join(f"{chain[i][0].target.name} -> {', '.join(chain[j][0].target.name for j in kids)}"
                    for i in range(len(chain)) if (kids := tree.children(i)))  # fmt: skip
    return f"{fed} (relayed)"


def _missed_text(missed: list[Step], result: PushResult, direct: list[str], anew: list[str]) -> str:
    """The warning for targets the relay tree did not deliver to: the nodes that failed, with why, and the nodes
    cut off with each (its subtree), then how the head feeds them now: ``direct`` itself, ``anew`` through a new
    relay tree."""
    names = [c.target.name for c in missed]
    failed = [n for n in names if n not in result.cut_by]
    parts = []
    for n in failed:
        below = [m for m in names if result.cut_by.get(m) == n]
        parts.append(
            f"{n} failed ({result.failures[n].message})" + (f", cutting off {', '.join(below)}" if below else "")
        )
    how = [f"sending to {', '.join(direct)} from the head"] if direct else []
    how += [f"sending to {', '.join(anew)} through a new relay tree"] if anew else []
    return f"the relay tree did not deliver to every node: {'; '.join(parts)}; {' and '.join(how)}"


def _relay_trees(steps: list[Step], travels: int, mode: RelayMode, rep: _SafeReporter) -> list[Relayed]:
    """The targets of one stream that relay it to each other, in one relay tree (:mod:`nodekit.ship.tree`): the
    head's link carries one copy however many they are. Their hops log in with keys made for the push
    (nodekit.ship.hopkeys), never the user's."""
    ssh_steps = relay_candidates(steps, travels, mode)
    if not ssh_steps:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(ssh_steps))) as pool:
        hops = list(pool.map(lambda s: hop_of(s.target.name, s.target.endpoint), ssh_steps))
    chain = [(s, h) for s, h in zip(ssh_steps, hops, strict=True) if isinstance(h, Hop)]
    for s, h in zip(ssh_steps, hops, strict=True):
        if not isinstance(h, Hop):
            rep.detail(f"{s.target.name}: not in the relay tree ({h}); sent from the head")
    if len(chain) < 2:
        return []
    return [chain]
