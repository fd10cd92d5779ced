"""Which loading targets share one stream, and which of those may relay it to each other: pure, from the plan.
Used by :mod:`nodekit.ship.fanout` and by ``push --dry-run``."""

from __future__ import annotations

from collections.abc import Sequence

from nodekit.ship.codecs import Codec
from nodekit.ship.plan import PushPlan, Step, travelling_bytes
from nodekit.ship.relay import RELAY_MIN_BYTES, RelayMode
from nodekit.ship.tree import plan_tree, shape_lines


def relay_candidates(steps: Sequence[Step], travels: int, mode: RelayMode) -> list[Step]:
    """Pure: the loading targets of one stream that may relay it to each other (``ssh://``, at least two, and in
    ``auto`` at least ``RELAY_MIN_BYTES`` travelling); empty when none relay. Whether each can take part is only
    known from the head's ssh config and known_hosts (:func:`~nodekit.ship.dial.hop_of`)."""
    ssh_steps = [s for s in steps if s.target.endpoint.startswith("ssh://")]
    if mode == "never" or len(ssh_steps) < 2 or (mode == "auto" and travels < RELAY_MIN_BYTES):
        return []
    return ssh_steps


def relay_text(plan: PushPlan, mode: RelayMode) -> list[str]:
    """What ``push --dry-run`` says about relays: per stream that would be relayed, the tree's shape (who feeds
    whom) and the copies of that stream on the head's link."""
    out = []
    for steps in groups(plan.loads()).values():
        candidates = relay_candidates(steps, travelling_bytes(plan.source.size, steps[0].layers), mode)
        if not candidates:
            continue
        direct = len(steps) - len(candidates)
        out.append(f"  relayed: {len(candidates)} nodes in one tree, each passing the stream on while it loads it; "
                   f"the head's link carries {1 + direct} cop{'y' if direct == 0 else 'ies'} of this stream"
                   + (f" (one for the tree, one per target fed directly: {direct})" if direct else "")
                   + "; a node whose host key the head lacks is fed directly")  # fmt: skip
        out += shape_lines([s.target.name for s in candidates], plan_tree(len(candidates)), indent="    ")
    return out


def groups(loads: Sequence[Step]) -> dict[tuple[Codec, frozenset[str]], list[Step]]:
    """Loading targets that lack the same layers and take the same compression: they share one stream."""
    groups: dict[tuple[Codec, frozenset[str]], list[Step]] = {}
    for s in loads:
        skip = s.layers.skip_ids if s.layers is not None else frozenset()
        groups.setdefault((s.codec, skip), []).append(s)
    return groups
