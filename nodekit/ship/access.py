"""Carrying out a relay tree's per-push access on its nodes (:class:`TreeAccess`): the setup, authorize and end
steps of :mod:`nodekit.ship.hopkeys` (which says what each does and why), run on every node over the head's own
connection, many nodes at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from nodekit.errors import DeadlineError, ShipError
from nodekit.ship.hopkeys import (
    CALL_S,
    KEY_LIFETIME_S,
    Hop,
    Prepared,
    authorize_command,
    authorized_line,
    end_command,
    entry_command,
    node_argv,
    parse_setup,
    put_command,
    setup_command,
)
from nodekit.ship.tree import Tree, plan_tree
from nodekit.system import proc

PARALLEL = 32
"""Nodes set up, authorised or ended at once: a tree holds every node of a push (hundreds), each call a short SSH
session from the head."""


T = TypeVar("T")


def _each(fn: Callable[[int], T], n: int) -> list[T]:
    if n == 0:
        return []
    with ThreadPoolExecutor(max_workers=min(PARALLEL, n)) as pool:
        return list(pool.map(fn, range(n)))


def _on(hop: Hop, command: str, what: str, given: bytes | None = None) -> tuple[bool, str]:
    """Run ``command`` on ``hop`` over the head's own connection (``given``: its standard input): (ok, stdout or
    why not)."""
    try:
        got = proc.run(node_argv(hop, command), deadline=CALL_S, what=f"{what} on {hop.name}", fix="",
                       stdin="devnull", given=given)  # fmt: skip
    except (OSError, DeadlineError) as e:
        return False, str(e)
    if got.returncode != 0:
        said = [ln.strip() for ln in got.stderr.splitlines() if ln.strip()]
        return False, f"exit {got.returncode}" + (f": {said[-1][:200]}" if said else "")
    return True, got.stdout


class TreeAccess:
    """A relay tree's per-push access on its nodes: :meth:`open` sets up every node and authorises each hop (each
    node accepts the key its feeder made for it), returning the command that starts the root's relay step;
    :meth:`close` ends it all (idempotent, never raises). ``tree`` defaults to :func:`~nodekit.ship.tree.plan_tree`
    over ``hops``. ``given``: per node (in order), a word and a file the head writes into its directory at setup
    (``./arg``, ``./given``) for its relay step to consume: what a node takes in is fixed by the head, never by the
    stream."""

    def __init__(
        self,
        hops: Sequence[Hop],
        relay_script: str,
        *,
        tree: Tree | None = None,
        lifetime_s: int | None = None,
        given: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        self.hops = list(hops)
        self.tree = plan_tree(len(self.hops)) if tree is None else tree
        if len(self.tree) != len(self.hops) or self.tree.head_copies != 1 or self.tree.parent[:1] != (None,):
            raise ValueError("a relay tree has one node per hop and one root, the first")
        self._script = relay_script
        self._given = list(given) if given is not None else None
        if self._given is not None and len(self._given) != len(self.hops):
            raise ValueError("one given input per hop")
        self._lifetime = KEY_LIFETIME_S if lifetime_s is None else lifetime_s
        self.prepared: dict[str, Prepared] = {}
        self.authorized: dict[str, str] = {}
        """Per node: the key whose line was written there."""

    def open(self) -> str:
        """Set up every node and authorise every hop; ShipError naming the first node that could not be (what
        was done is undone first)."""
        hops, tree = self.hops, self.tree

        def setup(i: int) -> Prepared | str:
            feeds = [hops[j] for j in tree.children(i)]
            ok, out = _on(hops[i], setup_command(hops[i], feeds, self._script), "preparing the relay")
            return parse_setup(out, feeds=len(feeds)) if ok else out

        done = _each(setup, len(hops))
        self.prepared = {h.name: got for h, got in zip(hops, done, strict=True) if isinstance(got, Prepared)}
        for h, got in zip(hops, done, strict=True):
            if isinstance(got, str):
                self._fail(h, f"preparing the relay there failed ({got})")
        if (given := self._given) is not None:

            def put(i: int) -> tuple[bool, str]:
                command = put_command(self.prepared[hops[i].name].dir, given[i][0])
                return _on(hops[i], command, "handing the relay its input", given[i][1])

            for h, (ok, why) in zip(hops, _each(put, len(hops)), strict=True):
                if not ok:
                    self._fail(h, f"its input could not be written there ({why})")

        def authorize(i: int) -> tuple[bool, str]:
            p = tree.parent[i]
            assert p is not None
            before = self.prepared[hops[p].name].dials[tree.children(p).index(i)]
            here = self.prepared[hops[i].name]
            command = authorize_command(authorized_line(before, here), self._lifetime, here.dir, before.key)
            ok, out = _on(hops[i], command, "authorising the relay's hop key")
            if ok:
                self.authorized[hops[i].name] = before.key
            return ok, out

        fed = [i for i in range(len(hops)) if tree.parent[i] is not None]
        for i, (ok, why) in zip(fed, _each(lambda n: authorize(fed[n]), len(fed)), strict=True):
            if not ok:
                self._fail(hops[i], f"its authorized_keys could not take the hop key ({why})")
        return entry_command(self.prepared[hops[0].name].dir)

    def _fail(self, hop: Hop, why: str) -> None:
        self.close()
        raise ShipError(f"cannot relay through {hop.name}: {why}", node=hop.name)

    def close(self, *, kill: bool = False) -> None:
        """On every node set up: end its relay step if ``kill`` (only what it recorded itself), remove its
        directory and the hop key line written there. Best effort (a dead node is left to the line's expiry)."""
        todo = [(h, self.prepared.pop(h.name)) for h in self.hops if h.name in self.prepared]
        keys = {h.name: self.authorized.pop(h.name, "") for h, _ in todo}
        _each(lambda i: _on(todo[i][0], end_command(todo[i][1].dir, keys[todo[i][0].name], kill=kill),
                            "ending the relay"), len(todo))  # fmt: skip
