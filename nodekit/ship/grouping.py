"""Which loading targets share one stream, and which of those may relay it to each other: pure, from the plan.
Used by :mod:`nodekit.ship.fanout` and by ``push --dry-run``."""

from __future__ import annotations

from collections.abc import Sequence

from nodekit.ship.codecs import Codec
from nodekit.ship.plan import PushPlan, Step, travelling_bytes
from nodekit.ship.relay import RELAY_MIN_BYTES, RelayMode, split_chains


def relay_candidates(steps: Sequence[Step], travels: int, mode: RelayMode) -> list[Step]:
    """Pure: the loading targets of one stream that may relay it to each other (``ssh://``, at least two, and in
    ``auto`` at least ``RELAY_MIN_BYTES`` travelling); empty when none relay. Whether each can take part is only
    known from the head's ssh config and known_hosts (:func:`~nodekit.ship.relay.hop_of`)."""
    ssh_steps = [s for s in steps if s.target.endpoint.startswith("ssh://")]
    if mode == "never" or len(ssh_steps) < 2 or (mode == "auto" and travels < RELAY_MIN_BYTES):
        return []
    return ssh_steps


def relay_text(plan: PushPlan, mode: RelayMode) -> list[str]:
    """What ``push --dry-run`` says about relays: one line per stream that would be relayed."""
    out = []
    for steps in groups(plan.loads()).values():
        candidates = relay_candidates(steps, travelling_bytes(plan.source.size, steps[0].layers), mode)
        for r in split_chains(len(candidates)):
            chain = candidates[r.start : r.stop]
            out.append(f"  relayed: {' -> '.join(s.target.name for s in chain)} (each passes the stream on; the "
                       "head sends it once; a node whose host key the head lacks is fed directly)")  # fmt: skip
    return out


def groups(loads: Sequence[Step]) -> dict[tuple[Codec, frozenset[str]], list[Step]]:
    """Loading targets that lack the same layers and take the same compression: they share one stream."""
    groups: dict[tuple[Codec, frozenset[str]], list[Step]] = {}
    for s in loads:
        skip = s.layers.skip_ids if s.layers is not None else frozenset()
        groups.setdefault((s.codec, skip), []).append(s)
    return groups
