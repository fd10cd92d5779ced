"""What one host's target needs to become the source, decided from the source's manifest and the host's scan. Pure.

Content-addressed: a content the host already holds under any name nodekit wrote (or a complete one a killed push
left in staging) is copied there, not sent; each content travels at most once per host, however many names share
it. A name nodekit wrote that the source no longer has is deleted. A file nodekit did not write is never
overwritten or deleted: where it is identical to the source's file of that name it is adopted (it stays, and from
then on nodekit keeps it), any other one refuses the host with the fix, since the target could then never equal
the source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodekit.errors import UsageError
from nodekit.launcher.datasync.scan import Manifest

HEADROOM = 1.05
"""Free disk a push needs: what it writes, and 5 % more."""
SLACK_BYTES = 1 << 20


class TargetNotEmpty(UsageError):
    """A target holds files nodekit did not put there, which differ from the source's."""


class NoRoom(UsageError):
    """A host lacks the free disk a push needs; nothing was sent anywhere."""


@dataclass(frozen=True)
class NodeView:
    """A host's scan (:func:`nodekit.launcher.datasync.node.scan`)."""

    owned: Manifest
    foreign: Mapping[str, Sequence[Any]]  # name -> [size, kind] (+ hash where the source has that name and size)
    staged: Mapping[str, int] = field(default_factory=dict)
    free: int | None = None

    @staticmethod
    def of(answer: Mapping[str, Any]) -> NodeView:
        owned = {str(n): (int(v[0]), str(v[1])) for n, v in answer.get("owned", {}).items()}
        return NodeView(owned, dict(answer.get("foreign", {})), dict(answer.get("staged", {})), answer.get("free"))


@dataclass(frozen=True)
class HostPlan:
    """One target's plan: the receiver's input (:meth:`to_json`) and what it costs."""

    want: Manifest
    adopt: tuple[str, ...]
    delete: tuple[str, ...]
    copy: Mapping[str, str]  # content hash -> a name on the host that holds it
    incoming: Mapping[str, int]  # content hash -> size: what travels
    place: Mapping[str, str]  # name -> content hash

    @property
    def send_bytes(self) -> int:
        return sum(self.incoming.values())

    @property
    def write_bytes(self) -> int:
        """Bytes the host writes (staging, then renamed in place): its disk must hold them beside what is there."""
        return sum(self.want[n][0] for n in self.place)

    @property
    def changes(self) -> bool:
        return bool(self.place or self.delete or self.adopt)

    def to_json(self) -> dict[str, Any]:
        return {
            "want": {n: [s, h, "f"] for n, (s, h) in self.want.items()},
            "adopt": list(self.adopt),
            "delete": list(self.delete),
            "copy": dict(self.copy),
            "incoming": dict(self.incoming),
            "place": dict(self.place),
        }


def plan_host(want: Manifest, node: NodeView, *, where: str) -> HostPlan:
    """The plan that makes ``node``'s target equal ``want``; TargetNotEmpty when files nodekit did not write are in
    the way (``where`` names the host and path in the message)."""
    in_the_way = sorted(
        n for n, v in node.foreign.items() if not (len(v) == 3 and v[1] == "f" and n in want and want[n][1] == v[2])
    )
    if in_the_way:
        shown = ", ".join(in_the_way[:3]) + (f" and {len(in_the_way) - 3} more" if len(in_the_way) > 3 else "")
        raise TargetNotEmpty(
            f"{where} holds {len(in_the_way)} file(s) nodekit did not put there and that differ from the source "
            f"({shown}); nodekit never overwrites or deletes them",
            fix="move them out of that directory, or point the mount's host at an empty (or new) directory",
        )
    adopt = tuple(sorted(node.foreign))
    keep = {n for n, v in node.owned.items() if want.get(n) == v}
    delete = tuple(sorted(n for n in node.owned if n not in want))
    place = {n: h for n, (_, h) in want.items() if n not in keep and n not in node.foreign}
    held: dict[str, str] = {}
    for n, (_, h) in sorted(node.owned.items()):
        held.setdefault(h, n)
    for n in adopt:
        held.setdefault(want[n][1], n)
    sizes = {h: s for s, h in want.values()}
    needed = sorted(set(place.values()))
    copy = {h: held[h] for h in needed if h not in node.staged and h in held}
    # Smallest first: a push cut short has finished the most files, and the next one sends only the rest.
    incoming = {
        h: sizes[h] for h in sorted(needed, key=lambda h: (sizes[h], h)) if h not in node.staged and h not in held
    }
    return HostPlan(want, adopt, delete, copy, incoming, place)


def room_problem(plan: HostPlan, free: int | None, *, where: str) -> NoRoom | None:
    """NoRoom when the host's free disk (None: unknown, not refused) is short of what the plan writes."""
    need = int(plan.write_bytes * HEADROOM) + SLACK_BYTES if plan.place else 0
    if free is None or need <= free:
        return None
    return NoRoom(
        f"{where} has {free / 2**20:.0f} MiB free; the dataset needs about {need / 2**20:.0f} MiB there",
        fix="free disk on that host, or point the mount's host at a larger file system",
    )


def summary(plan: HostPlan) -> str:
    """One line: what travels and what changes on the host."""
    if not plan.changes:
        return "up to date: nothing to send"
    parts = [f"send {len(plan.incoming)} file(s), {plan.send_bytes} bytes"]
    if plan.copy:
        parts.append(f"copy {len(plan.copy)} there")
    if plan.delete:
        parts.append(f"delete {len(plan.delete)}")
    if plan.adopt:
        parts.append(f"keep {len(plan.adopt)} identical file(s) already there")
    return ", ".join(parts)
