"""Who feeds whom when a stream is relayed: a tree over the nodes that take it, pure.

The head feeds one node (the root); every node passes the stream on to at most :data:`FANOUT` others while it
loads it. The head's link then carries one copy whatever the number of nodes, each node's link carries its own copy
in and at most ``FANOUT`` out, and the last node is ``log_FANOUT(N)`` hops from the head. A chain is the tree with a
fan-out of one (the same code path, tested as such).

Why two: a node's uplink carries ``FANOUT`` copies, so the stream moves at about ``1/FANOUT`` of a node's link,
while each level adds one SSH handshake (a few tenths of a second) before the stream reaches it. For a 6 GB image
over 10 Gbit/s links, two makes the stream ~10 s and 512 nodes 9 levels (~3 s of handshakes); three makes it ~15 s
with 6 levels (~2 s). Bytes dominate past a few hundred MB, so two; one more level costs less than a third copy.

A node that fails (it dies, its hop is refused, its load stalls) cuts only its subtree: :func:`cut_off` names it,
and the head feeds those nodes again (:mod:`nodekit.ship.fanout`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FANOUT = 2
"""How many nodes each node passes the stream on to (the module docstring says why two)."""


@dataclass(frozen=True)
class Tree:
    """``parent[i]``: the index of the node that feeds node ``i``, or ``None`` for the root (fed by the head).
    Nodes are numbered in breadth-first order: a parent always comes before its children."""

    parent: tuple[int | None, ...]

    def __len__(self) -> int:
        return len(self.parent)

    def children(self, i: int) -> tuple[int, ...]:
        return tuple(j for j, p in enumerate(self.parent) if p == i)

    def depth(self, i: int) -> int:
        """Hops from the head to node ``i`` (the root is 1)."""
        d, p = 1, self.parent[i]
        while p is not None:
            d, p = d + 1, self.parent[p]
        return d

    @property
    def height(self) -> int:
        return max((self.depth(i) for i in range(len(self))), default=0)

    @property
    def fanout(self) -> int:
        """The most nodes any one node feeds."""
        return max((len(self.children(i)) for i in range(len(self))), default=0)

    def below(self, i: int) -> list[int]:
        """Every node whose stream passes through node ``i`` (``i`` itself not included), breadth first."""
        out, todo = [], list(self.children(i))
        while todo:
            j = todo.pop(0)
            out.append(j)
            todo += self.children(j)
        return out

    @property
    def head_copies(self) -> int:
        """Copies of the stream on the head's link: one per root."""
        return sum(p is None for p in self.parent)


def plan_tree(n: int, fanout: int | None = None) -> Tree:
    """Pure: ``n`` nodes (in order) in a tree the head feeds through node 0, each node feeding at most ``fanout``
    (default :data:`FANOUT`) others, as shallow as that allows (node ``i`` is fed by node ``(i - 1) // fanout``).
    ``fanout`` 1 is a chain."""
    k = max(FANOUT if fanout is None else fanout, 1)
    return Tree(tuple(None if i == 0 else (i - 1) // k for i in range(max(n, 0))))


def cut_off(tree: Tree, failed: Iterable[int]) -> dict[int, int]:
    """Pure: the nodes in ``failed`` or not that are below a node in ``failed``, each with the highest failed node
    above it: the one whose failure cut it off (the one to name). A node in ``failed`` with no failed node above it
    is not in the answer: it failed on its own."""
    bad = set(failed)
    out: dict[int, int] = {}
    for i in range(len(tree)):
        p, top = tree.parent[i], None
        while p is not None:
            if p in bad:
                top = p
            p = tree.parent[p]
        if top is not None:
            out[i] = top
    return out


def shape_lines(names: Sequence[str], tree: Tree, *, indent: str = "  ") -> list[str]:
    """What a dry run prints of ``tree`` over ``names``: who feeds whom, one line per node that feeds others, and
    the copies on the head's link."""
    if not len(tree):
        return []
    lines = [f"{indent}the head feeds {', '.join(names[i] for i in range(len(tree)) if tree.parent[i] is None)}"]
    lines += [f"{indent}{names[i]} feeds {', '.join(names[j] for j in kids)}"
              for i in range(len(tree)) if (kids := tree.children(i))]  # fmt: skip
    lines.append(
        f"{indent}{len(tree)} nodes, at most {max(tree.fanout, 1)} fed by each, {tree.height} hop(s) deep; "
        f"{tree.head_copies} copy of the stream on the head's link"
    )
    return lines
