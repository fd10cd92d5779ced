"""The link check's rounds, driven over the preflight store after a good preflight (every node runs this).

Keys (under ``nodekit/link/``)::

    end/<r>       JSON Endpoint: where node r listens (its training address and interface, an ephemeral port)
    pair/<a>-<b>  JSON Pair: what node a measured with node b (a < b), written before a joins the round's barrier
    round/<i>     counter: nodes done with round i; nobody starts round i + 1 before it reaches nnodes
    verdict       JSON LinkVerdict, written once by main after the last round
    seen/<r>      node r has read the verdict; main keeps the store up until every node has (bounded)

The barrier keeps the pairs of a round disjoint in time as well as in nodes: a node that finished early never
starts its next transfer while its next partner is still measuring the previous one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from nodekit.launcher.linkcheck.listener import LinkServer
from nodekit.launcher.linkcheck.probe import CONNECT_S, DRAIN_S, TRIES, measure
from nodekit.launcher.linkcheck.rounds import partner, round_deadline_s, rounds
from nodekit.launcher.linkcheck.verdict import Endpoint, LinkVerdict, Mode, Pair, Transfer, decide
from nodekit.launcher.preflight.exchange import POLL_S, Clock, PreflightError, Store, _key

SEEN_WAIT_S = 15.0
ENDPOINTS_WAIT_S = 60.0


@dataclass(frozen=True)
class LinkJob:
    """What one node's check needs: who it is, where it listens, the policy, and the job secret."""

    rank: int
    nnodes: int
    host: str
    addr: str  # where the others reach this node (published)
    iface: str
    secret: str
    mode: Mode = "warn"
    min_gbit: float | None = None
    seconds: float = 0.2
    bind: str | None = None  # the local address to listen on and send from; None: ``addr`` (it is this node's own)


def _k(*parts: object) -> str:
    return _key("link", *parts)


def _wait(store: Store, keys: list[str], deadline: float, clock: Clock) -> bool:
    while not store.check(keys):
        if clock.now() >= deadline:
            return False
        clock.sleep(POLL_S)
    return True


def _barrier(store: Store, name: str, nnodes: int, deadline: float, clock: Clock) -> bool:
    store.add(_k(name), 1)
    while int(store.add(_k(name), 0)) < nnodes:
        if clock.now() >= deadline:
            return False
        clock.sleep(POLL_S)
    return True


def run(store: Store, job: LinkJob, run_id: bytes, clock: Clock | None = None) -> LinkVerdict:
    """Listen, measure this node's pairs round by round, and return main's verdict (main decides it). A lost
    store is a :class:`PreflightError`."""
    clock = clock or Clock()
    try:
        return _run(store, job, run_id, clock)
    except RuntimeError as e:  # StoreError: main went away mid-check
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PreflightError(f"lost main's store during the link check: {first}") from e


def _run(store: Store, job: LinkJob, run_id: bytes, clock: Clock) -> LinkVerdict:
    start = clock.now()
    local = job.addr if job.bind is None else job.bind
    try:
        server = LinkServer(job.secret, run_id, local).start()
    except OSError as err:
        why = err.strerror or err
        raise PreflightError(f"cannot listen for the link check on {local or 'any address'}: {why}") from err
    try:
        me = Endpoint(job.rank, job.host, job.addr, job.iface, server.port)
        store.set(_k("end", job.rank), json.dumps(asdict(me)))
        ranks = range(job.nnodes)
        if not _wait(store, [_k("end", r) for r in ranks], clock.now() + ENDPOINTS_WAIT_S, clock):
            raise PreflightError(f"not every node published its link check endpoint within {ENDPOINTS_WAIT_S:g} s")
        ends = {r: Endpoint(**json.loads(store.get(_k("end", r)))) for r in ranks}
        schedule = rounds(job.nnodes)
        per_round = round_deadline_s(job.seconds, TRIES * CONNECT_S, DRAIN_S)
        finished = True
        for i in range(len(schedule)):
            mate = partner(schedule, i, job.rank)
            if mate is not None and job.rank < mate:
                e = ends[mate]
                pair = measure(job.rank, mate, e.addr, e.port, job.secret, run_id, job.seconds, source=local or None)
                store.set(_k("pair", f"{job.rank}-{mate}"), json.dumps(pair.to_json_dict()))
            if not _barrier(store, f"round/{i}", job.nnodes, clock.now() + per_round, clock):
                finished = False  # a node is stuck or gone: decide on what was measured
                break
    finally:
        server.close()
    if job.rank == 0:
        return _decide(store, job, ends, schedule, clock.now() - start, finished, clock)
    deadline = clock.now() + per_round * (len(schedule) + 1) + SEEN_WAIT_S
    if not _wait(store, [_k("verdict")], deadline, clock):
        raise PreflightError("main published no link check verdict (is node 0 stuck? see its log)")
    verdict = LinkVerdict.from_json(store.get(_k("verdict")))
    store.set(_k("seen", job.rank), "1")
    return verdict


def _decide(
    store: Store,
    job: LinkJob,
    ends: dict[int, Endpoint],
    schedule: list[list[tuple[int, int]]],
    took: float,
    finished: bool,
    clock: Clock,
) -> LinkVerdict:
    pairs = []
    for a, b in (p for r in schedule for p in r):
        key = _k("pair", f"{a}-{b}")
        if store.check([key]):
            pairs.append(Pair.from_json_dict(json.loads(store.get(key))))
        else:
            why = "not measured: the check stopped at a stuck node" if not finished else f"node {a} reported nothing"
            pairs.append(Pair(a, b, Transfer(), Transfer(), error=why))
    verdict = decide(list(ends.values()), pairs, mode=job.mode, min_gbit=job.min_gbit, seconds=job.seconds, took_s=took)
    store.set(_k("verdict"), verdict.to_json())
    _wait(store, [_k("seen", r) for r in range(1, job.nnodes)], clock.now() + SEEN_WAIT_S, clock)
    return verdict
