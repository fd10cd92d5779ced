"""The link check's rounds, driven over the preflight store after a good preflight (every node runs this).

Keys (under ``nodekit/link/``)::

    end/<r>       JSON Endpoint: where node r listens (its training address and interface, an ephemeral port)
    ready         counter: nodes that published their endpoint; nobody starts round 0 before it reaches nnodes
    pair/<a>-<b>  JSON Pair: what node a measured with node b (a < b), written before a joins the round's barrier
    round/<i>     counter: nodes done with round i; nobody starts round i + 1 before it reaches nnodes
    narrow        JSON list of rounds (sampled checks only): the re-tests main planned from the survey's pairs
    verdict       JSON LinkVerdict, written once by main after the last round
    seen/<r>      node r has read the verdict; main keeps the store up until every node has (bounded)

The barrier keeps the pairs of a round disjoint in time as well as in nodes: a node that finished early never
starts its next transfer while its next partner is still measuring the previous one. A node reads only the
endpoints of the partners it connects to (main reads them all, for the verdict): every node reading every
endpoint would be ``n^2`` reads on main's store, 260,000 at 512 nodes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from nodekit.launcher.linkcheck.apart import Apart, ListenError, Meter, Meters
from nodekit.launcher.linkcheck.probe import CONNECT_S, DRAIN_S, TRIES
from nodekit.launcher.linkcheck.rounds import (
    BARRIER_POLL_S,
    Round,
    partner,
    plan_rounds,
    poll_s,
    round_deadline_s,
    sampled,
    survey,
)
from nodekit.launcher.linkcheck.verdict import Endpoint, LinkVerdict, Mode, Pair, Transfer, decide, narrow
from nodekit.launcher.preflight.exchange import Clock, PreflightError, Store, _key

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


def _wait(store: Store, keys: list[str], deadline: float, clock: Clock, poll: float = BARRIER_POLL_S) -> bool:
    while not store.check(keys):
        if clock.now() >= deadline:
            return False
        clock.sleep(poll)
    return True


def _barrier(store: Store, name: str, nnodes: int, deadline: float, clock: Clock) -> bool:
    store.add(_k(name), 1)
    while int(store.add(_k(name), 0)) < nnodes:
        if clock.now() >= deadline:
            return False
        clock.sleep(poll_s(nnodes))
    return True


def run(store: Store, job: LinkJob, run_id: bytes, clock: Clock | None = None, meters: Meters = Apart) -> LinkVerdict:
    """Listen, measure this node's pairs round by round, and return main's verdict (main decides it). A lost
    store is a :class:`PreflightError`. ``meters``: where the listener and the transfers run, by default a
    process of their own (``apart.py``)."""
    clock = clock or Clock()
    try:
        return _run(store, job, run_id, clock, meters)
    except RuntimeError as e:  # StoreError: main went away mid-check
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PreflightError(f"lost main's store during the link check: {first}") from e


class _Endpoints:
    """The endpoints this node has read, each read once when first needed."""

    def __init__(self, store: Store) -> None:
        self.store, self.known = store, dict[int, Endpoint]()

    def __getitem__(self, rank: int) -> Endpoint:
        if rank not in self.known:
            self.known[rank] = Endpoint(**json.loads(self.store.get(_k("end", rank))))
        return self.known[rank]


def _run(store: Store, job: LinkJob, run_id: bytes, clock: Clock, meters: Meters) -> LinkVerdict:
    start = clock.now()
    local = job.addr if job.bind is None else job.bind
    try:
        meter = meters(job.secret, run_id, local)
    except ListenError as err:
        raise PreflightError(f"cannot listen for the link check on {local or 'any address'}: {err}") from err
    n = job.nnodes
    per_round = round_deadline_s(job.seconds, TRIES * CONNECT_S, DRAIN_S)
    try:
        me = Endpoint(job.rank, job.host, job.addr, job.iface, meter.port)
        store.set(_k("end", job.rank), json.dumps(asdict(me)))
        if not _barrier(store, "ready", n, clock.now() + ENDPOINTS_WAIT_S, clock):
            raise PreflightError(f"not every node published its link check endpoint within {ENDPOINTS_WAIT_S:g} s")
        ends = _Endpoints(store)
        schedule = survey(n, run_id)
        finished = _measure(store, job, meter, schedule, 0, ends, local, per_round, clock)
        if sampled(n):
            more = _narrowing(store, job, ends, schedule, finished, per_round, clock)
            finished = finished and _measure(store, job, meter, more, len(schedule), ends, local, per_round, clock)
            schedule = schedule + more
    finally:
        meter.close()
    if job.rank == 0:
        return _decide(store, job, ends, schedule, clock.now() - start, finished, clock)
    deadline = clock.now() + per_round * (plan_rounds(n) + 1) + SEEN_WAIT_S
    if not _wait(store, [_k("verdict")], deadline, clock, poll_s(n)):
        raise PreflightError("main published no link check verdict (is node 0 stuck? see its log)")
    verdict = LinkVerdict.from_json(store.get(_k("verdict")))
    store.set(_k("seen", job.rank), "1")
    return verdict


def _measure(
    store: Store,
    job: LinkJob,
    meter: Meter,
    schedule: list[Round],
    first_no: int,
    ends: _Endpoints,
    local: str,
    per_round: float,
    clock: Clock,
) -> bool:
    """This node's pairs of ``schedule``, round by round (numbered from ``first_no``); False when a round's barrier
    was not reached in time (a node is stuck or gone: decide on what was measured)."""
    for i in range(len(schedule)):
        mate = partner(schedule, i, job.rank)
        if mate is not None and job.rank < mate:
            e = ends[mate]
            pair = meter.measure(job.rank, mate, e.addr, e.port, job.seconds, local or None)
            store.set(_k("pair", f"{job.rank}-{mate}"), json.dumps(pair.to_json_dict()))
        if not _barrier(store, f"round/{first_no + i}", job.nnodes, clock.now() + per_round, clock):
            return False
    return True


def _narrowing(
    store: Store,
    job: LinkJob,
    ends: _Endpoints,
    schedule: list[Round],
    finished: bool,
    per_round: float,
    clock: Clock,
) -> list[Round]:
    """The re-tests after a sampled survey: main plans them from the survey's pairs and publishes them (none after
    a stuck survey); the others read them. A node that has none in time measures none (main's barrier then names
    the check unfinished)."""
    if job.rank == 0:
        more = []
        if finished:
            everyone = [ends[r] for r in range(job.nnodes)]
            got = _pairs(store, schedule, finished)
            more = narrow(everyone, got, mode=job.mode, min_gbit=job.min_gbit)
        store.set(_k("narrow"), json.dumps(more))
        return more
    if not finished or not _wait(store, [_k("narrow")], clock.now() + per_round, clock, poll_s(job.nnodes)):
        return []
    return [[(int(a), int(b)) for a, b in r] for r in json.loads(store.get(_k("narrow")))]


def _pairs(store: Store, schedule: list[Round], finished: bool) -> list[Pair]:
    """Main: what was measured for every pair of ``schedule``; a pair nobody reported is a pair without a transfer."""
    pairs = []
    for a, b in (p for r in schedule for p in r):
        key = _k("pair", f"{a}-{b}")
        if store.check([key]):
            pairs.append(Pair.from_json_dict(json.loads(store.get(key))))
        else:
            why = "not measured: the check stopped at a stuck node" if not finished else f"node {a} reported nothing"
            pairs.append(Pair(a, b, Transfer(), Transfer(), error=why))
    return pairs


def _decide(
    store: Store,
    job: LinkJob,
    ends: _Endpoints,
    schedule: list[Round],
    took: float,
    finished: bool,
    clock: Clock,
) -> LinkVerdict:
    pairs = _pairs(store, schedule, finished)
    everyone = [ends[r] for r in range(job.nnodes)]
    verdict = decide(everyone, pairs, mode=job.mode, min_gbit=job.min_gbit, seconds=job.seconds, took_s=took)
    store.set(_k("verdict"), verdict.to_json())
    _wait(store, [_k("seen", r) for r in range(1, job.nnodes)], clock.now() + SEEN_WAIT_S, clock)
    return verdict
