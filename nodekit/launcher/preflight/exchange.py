"""Preflight: every node publishes its facts to main, main compares, every node prints main's verdict.

The channel is nodekit's own store (``nodekit/launcher/store/``) on MASTER_ADDR:NODEKIT_PREFLIGHT_PORT, hosted by
node 0 (a port of its own, so no late torchrun client ever talks to it), fresh for every run and open only to
holders of the job secret (``nodekit/launcher/store/auth.py``: a mutual challenge per connection, then
authenticated frames). The protocol runs against the small :class:`Store` protocol, so it is testable with an
in-memory store.

Keys (all under ``nodekit/``)::

    claim/<r>    counter: how many nodes said they are rank r (more than one is a copy-paste compose file)
    facts/<r>    JSON StackReport of the first node with rank r; dup/<r>/<n> for the n-th claimant
    verdict      JSON Verdict, written once by main
    seen/<r>     counter: rank r has read the verdict; main keeps the store up until every arrival has, and after
                 a refusal until every node has (see :func:`linger`), so a late node learns the verdict too

Every wait polls in short steps instead of one long blocking call so that SIGTERM (``docker compose down``)
interrupts it between calls.
"""

from __future__ import annotations

import errno
import json
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from nodekit.launcher.config import LaunchConfig
from nodekit.launcher.preflight.stack import StackReport
from nodekit.launcher.preflight.verdict import Declared, Verdict, compare, decide
from nodekit.launcher.store.auth import NotNodekit, WrongSecret
from nodekit.launcher.store.client import Client
from nodekit.launcher.store.kv import LIMITS, NoHandshake, StoreError
from nodekit.launcher.store.server import host

PREFIX = "nodekit/"
# Every step of the exchange (facts in, verdict out, verdict read) is seen one poll late at worst, on the way to
# the first training step: 0.1 s made the preflight's own cost 0.10 s in every run; a store check is a loopback
# or LAN round trip of well under a millisecond, so 50 of them a second cost nothing.
POLL_S = 0.02
# How long main keeps the store up for arrived nodes to read the verdict. They poll every POLL_S, so this only
# matters when one of them died right after arriving.
ACK_TIMEOUT_S = 15.0
REACH_FAST_S, REACH_FAST_FOR_S = 0.05, 10.0  # wait_reachable's retry step, and for how long it is that short
# One connect attempt toward main. Longer than the kernel's neighbour resolution (3 probes, 1 s apart): a shorter
# attempt times out before the kernel can say "no route to host", and a wrong address looks like a slow main.
PROBE_S = 4.0
# Main unreachable (no route to host, network unreachable) for this long, with nothing else seen in between: the
# address is wrong or main's machine is down, and waiting out rdzv_timeout would only hide it. A refused
# connection (main's machine is there, its launcher not yet) or a timeout (a firewall) is still waited for.
UNREACHABLE_S = 3.0
UNREACHABLE = frozenset({"no route to host", "network unreachable"})
# After a refusal main keeps serving the verdict this long (at most; less if rdzv_timeout is shorter) for nodes
# that had not arrived yet: they get the verdict and exit 17 instead of retrying an absent main until their own
# rdzv_timeout. The report is printed before this wait, so the "report within 5 s" promise holds.
LINGER_S = 30.0
# A worker that reached main's port connects its store client within this; if main is gone by then (it ended the
# job between the probe and the connect), waiting out the store's full timeout would only hide that.
CONNECT_TIMEOUT_S = 10.0
# Workers wait this much longer for the verdict than main waits for nodes: main's clock started before theirs.
VERDICT_GRACE_S = 30.0
PROGRESS_EVERY_S = 30.0
# Quiet at first: on a healthy start the other nodes show up within a second or two, and "waiting" lines would
# be noise in every log.
FIRST_REPORT_S = 3.0


class Store(Protocol):
    """The four calls the protocol uses (those of ``torch.distributed.Store``; ``get`` waits for the key)."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...


class PreflightError(Exception):
    """Preflight could not finish: main unreachable, a node lost, the port taken. ``str()`` is one line."""


class SecretMismatch(PreflightError):
    """This node's job secret is not main's: it belongs to another job (or to a stale copy of this one)."""


@dataclass
class Clock:
    """Time and output, injectable for tests."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    log: Callable[[str], None] = field(default=lambda line: print(line, flush=True))


@dataclass(frozen=True)
class Outcome:
    """What preflight decided for this node: main's verdict, and whether this node holds a duplicate rank."""

    verdict: Verdict
    duplicate: bool = False
    late: bool = False
    settled_s: float | None = None
    """Main only: seconds from the last node's arrival to the end (decide, publish, every node confirmed): the
    preflight's own cost, apart from the nodes' start-up and the wait for them. None when a node never came."""


# ---- reachability (standard library only) ----------------------------------------------------------------------

_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "timed out",
}


def probe(addr: str, port: int, timeout: float) -> tuple[str | None, str | None]:
    """One raw TCP connect: ``(None, local_address)`` on success, ``(reason, None)`` on failure.

    The reason separates the three situations a user fixes differently: "connection refused" (main is up but
    nothing listens yet, or a firewall rejects), "no route to host"/"network unreachable" (wrong address or
    interface), "timed out" (a firewall silently drops, or the host is down).
    """
    try:
        with socket.create_connection((addr, port), timeout=timeout) as s:
            return None, str(s.getsockname()[0])
    except TimeoutError:
        return "timed out", None
    except OSError as e:
        return _REASONS.get(e.errno or 0, e.strerror or str(e)), None


def wait_reachable(cfg: LaunchConfig, deadline: float, clock: Clock) -> str:
    """Retry :func:`probe` against main's preflight port until it answers; return this node's local address.

    Main usually starts later than some workers (``nodekit up`` runs per node, by hand), so a refusal is normal
    at first; only the deadline turns it into an error, carrying the last reason seen. An address the kernel
    cannot reach at all (no route to host, network unreachable) for :data:`UNREACHABLE_S` is an error at once: a
    wrong ``--main``, or main's machine down, named within seconds rather than at the deadline.
    """
    start = clock.now()
    last_report = start + FIRST_REPORT_S - PROGRESS_EVERY_S
    target = f"{cfg.master_addr}:{cfg.preflight_port}"
    unreachable_since: float | None = None
    while True:
        remaining = deadline - clock.now()
        reason, local = probe(cfg.master_addr, cfg.preflight_port, max(0.05, min(PROBE_S, remaining)))
        if reason is None and local is not None:
            return local
        now = clock.now()
        if reason not in UNREACHABLE:
            unreachable_since = None
        elif unreachable_since is None:
            unreachable_since = now
        elif now - unreachable_since >= UNREACHABLE_S:
            raise PreflightError(
                f"main {target} is unreachable from this node ({reason}, {now - start:.0f} s after the first try): "
                f"the main address is wrong, or main's machine is down or not on this network. Fix: give node 0's "
                f"address as this node reaches it (nodekit up: --main; nodekit run: main in nodekit.toml; check: "
                f"`ip route get {cfg.master_addr}`; "
                f"`nodekit doctor --main {cfg.master_addr} --node-rank {cfg.node_rank}`)"
            )
        if now >= deadline:
            raise PreflightError(
                f"cannot reach main {target} ({reason}); gave up after NODEKIT_RDZV_TIMEOUT={cfg.rdzv_timeout:g} s. "
                f"Node ranks arrived: unknown (main never answered). Is node 0 running (`nodekit ps` there)? "
                f"From this node: `nodekit doctor --main {cfg.master_addr} --node-rank {cfg.node_rank}`"
            )
        if now - last_report >= PROGRESS_EVERY_S:
            clock.log(
                f"nodekit preflight: waiting for main {target} ({reason}), {now - start:.0f}/{cfg.rdzv_timeout:g} s"
            )
            last_report = now
        # Nodes started together find main's port closed until main's launcher has started; retry quickly then (a
        # refused connection costs a round trip), and every 0.5 s once main is plainly later than that.
        step = REACH_FAST_S if now - start < REACH_FAST_FOR_S else 0.5
        clock.sleep(min(step, max(0.0, deadline - now)))


# ---- the protocol (against any Store) --------------------------------------------------------------------------


def _key(*parts: object) -> str:
    return PREFIX + "/".join(str(p) for p in parts)


def _publish(store: Store, facts: StackReport) -> int:
    """Claim this node's rank and publish its facts; return how many nodes claimed the rank (1 = only us)."""
    n = int(store.add(_key("claim", facts.rank), 1))
    payload = _json(facts)
    store.set(_key("facts", facts.rank) if n == 1 else _key("dup", facts.rank, n), payload)
    return n


def _json(facts: StackReport) -> str:
    return json.dumps(facts.to_json_dict(), sort_keys=True)


def _facts(raw: bytes) -> StackReport:
    data: dict[str, Any] = json.loads(raw)
    return StackReport.from_json_dict(data)


def _policy(cfg: LaunchConfig) -> dict[str, Any]:
    declared = Declared(nproc=cfg.nproc_declared, gpus=cfg.gpus_declared) if cfg.nproc_declared else None
    return {"allow_heterogeneous_gpus": cfg.allow_heterogeneous_gpus, "declared": declared}


SECRET_FIX = "copy .nodekit/job-secret from main's project to that node's (or export one NODEKIT_JOB_SECRET everywhere)"


def _tell_wrong_secrets(store: Store, pending: set[int], told: set[tuple[int, str]], clock: Clock) -> None:
    """Say at once, once each, which expected nodes told main they hold another job secret (a worker whose check of
    main's proof failed says so: :func:`nodekit.launcher.store.auth.wrong_secret_notice`). Unauthenticated, so
    only said: nothing main waits for or decides changes."""
    notices = getattr(store, "wrong_secret", None)
    for rank, addr in notices() if callable(notices) else ():
        if rank in pending and (rank, addr) not in told:
            told.add((rank, addr))
            clock.log(f"nodekit preflight: node {rank} ({addr}) reached main with another job secret: {SECRET_FIX}")


def run_main(store: Store, cfg: LaunchConfig, facts: StackReport, clock: Clock) -> Outcome:
    """Node 0: publish, wait up to ``cfg.rdzv_timeout`` (counted from now: the store is up) for every node, decide,
    publish the verdict, and keep the store up until every node that arrived has read it (or ACK_TIMEOUT_S passes).
    """
    start = clock.now()
    deadline = start + cfg.rdzv_timeout
    _publish(store, facts)
    arrived: dict[int, StackReport] = {0: facts}
    pending = set(range(1, cfg.nnodes))
    last_report = start + FIRST_REPORT_S - PROGRESS_EVERY_S
    early = False
    all_here = start if not pending else None
    told: set[tuple[int, str]] = set()
    while pending:
        _tell_wrong_secrets(store, pending, told, clock)
        new = {r for r in pending if store.check([_key("facts", r)])}
        arrived |= {r: _facts(store.get(_key("facts", r))) for r in new}
        pending -= new
        if not pending:
            all_here = clock.now()
        # A mismatch among the nodes already here is final: say so now rather than after waiting out the
        # timeout for the rest (the missing ones are still named, as not yet arrived).
        if new and any(d.severity == "error" for d in compare(list(arrived.values()), **_policy(cfg))):
            early = bool(pending)
            break
        now = clock.now()
        if not pending or now >= deadline:
            break
        if now - last_report >= PROGRESS_EVERY_S:
            ranks = ", ".join(str(r) for r in sorted(pending))
            clock.log(
                f"nodekit preflight: hosting on port {cfg.preflight_port}, waiting for node(s) {ranks}, "
                f"{now - start:.0f}/{cfg.rdzv_timeout:g} s"
            )
            last_report = now
        clock.sleep(POLL_S)
    _tell_wrong_secrets(store, pending, told, clock)
    if missing := sorted({r for r, _ in told if r in pending}):
        clock.log(
            f"nodekit preflight: node(s) {', '.join(map(str, missing))} reached main with another job secret and "
            f"could not join: {SECRET_FIX}"
        )
    all_facts = list(arrived.values())
    duplicates: list[StackReport] = []
    for r in arrived:
        claims = int(store.add(_key("claim", r), 0))
        for n in range(2, claims + 1):
            if store.check([_key("dup", r, n)]):
                duplicates.append(_facts(store.get(_key("dup", r, n))))
    verdict = decide(
        all_facts,
        nnodes=cfg.nnodes,
        timeout_s=cfg.rdzv_timeout,
        main=f"{cfg.master_addr}:{cfg.preflight_port}",
        duplicates=duplicates,
        stopped_early=early,
        run_id=secrets.token_hex(8),
        **_policy(cfg),
    )
    store.set(_key("verdict"), verdict.to_json())
    # Without the peer watchdog the store dies with this preflight, so wait until every arrival has read the verdict.
    ack_deadline = clock.now() + ACK_TIMEOUT_S
    unseen = {f.rank for f in all_facts if f.rank != 0}
    while unseen and clock.now() < ack_deadline:
        unseen = {r for r in unseen if not store.check([_key("seen", r)])}
        if unseen:
            clock.sleep(POLL_S)
    if unseen:
        clock.log(
            f"nodekit preflight: node(s) {', '.join(map(str, sorted(unseen)))} did not confirm the verdict "
            f"within {ACK_TIMEOUT_S:g} s; continuing"
        )
    return Outcome(verdict=verdict, settled_s=None if all_here is None else clock.now() - all_here)


def linger(
    store: Store, cfg: LaunchConfig, verdict: Verdict, clock: Clock, window: float | None = None
) -> tuple[int, ...]:
    """Main, after a refusal: keep the store (and so the verdict) up until every other node has confirmed reading it,
    or ``window`` (default ``min(rdzv_timeout, LINGER_S)``) passes; return the ranks that never confirmed.

    Without this, a node that arrives after main decided finds nobody at the preflight port and retries until its
    own ``rdzv_timeout`` (minutes) and then reports main as unreachable instead of the mismatch.
    """
    window = min(cfg.rdzv_timeout, LINGER_S) if window is None else window
    deadline = clock.now() + window
    unseen = set(range(1, cfg.nnodes))
    while True:
        unseen = {r for r in unseen if not store.check([_key("seen", r)])}
        if not unseen or clock.now() >= deadline:
            break
        clock.sleep(POLL_S)
    if unseen:
        clock.log(
            f"nodekit preflight: node(s) {', '.join(map(str, sorted(unseen)))} never read the verdict "
            f"within {window:g} s; main ends the job"
        )
    return tuple(sorted(unseen))


def run_worker(store: Store, cfg: LaunchConfig, facts: StackReport, clock: Clock) -> Outcome:
    """Node r > 0: publish, wait for main's verdict, confirm it, and return it.

    Main decides at most ``rdzv_timeout`` after it started hosting, which was before we connected, so waiting
    ``rdzv_timeout`` (plus a grace) from now is always enough. A lost connection to main is a :class:`PreflightError`.
    """
    target = f"{cfg.master_addr}:{cfg.preflight_port}"
    try:
        claims = _publish(store, facts)
        verdict_deadline = clock.now() + cfg.rdzv_timeout + VERDICT_GRACE_S
        while not store.check([_key("verdict")]):
            if clock.now() >= verdict_deadline:
                raise PreflightError(
                    f"main {target} took our facts but gave no verdict within "
                    f"{cfg.rdzv_timeout + VERDICT_GRACE_S:g} s (is node 0 stuck? see its log)"
                )
            clock.sleep(POLL_S)
        verdict = Verdict.from_json(store.get(_key("verdict")))
        store.add(_key("seen", cfg.node_rank), 1)
    except RuntimeError as e:  # StoreError: main went away mid-protocol
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PreflightError(f"lost main {target} during preflight: {first}") from e
    late = cfg.node_rank in verdict.missing
    return Outcome(verdict=verdict, duplicate=claims > 1, late=late)


# ---- the store ------------------------------------------------------------------------------------------------


def open_store(cfg: LaunchConfig, timeout_s: float, connect_s: float | None = None) -> Any:
    """Main hosts a fresh store for this run (not waiting for workers: the protocol counts them itself); others
    connect, proving the job secret to main and checking main's proof of it.

    ``timeout_s`` bounds every store call; a client's connect retries are bounded by ``connect_s`` when given (a
    worker that has just seen main's port answer), so a main that ended the job in between is reported in seconds.
    Raises :class:`SecretMismatch` when main holds another secret, PreflightError for everything else.
    """
    target = f"{cfg.master_addr}:{cfg.preflight_port}"
    if cfg.is_main:
        limits = replace(LIMITS, max_sessions=max(LIMITS.max_sessions, 2 * cfg.nnodes))
        try:
            return host(cfg.job_secret, cfg.preflight_port, timeout_s=timeout_s, limits=limits)
        except OSError as e:
            raise PreflightError(
                f"cannot host the preflight store on port {cfg.preflight_port}: {e.strerror or e} (another job on "
                f"this node? `nodekit ps`; or change master_port)"
            ) from e
    try:
        return Client.connect(
            cfg.master_addr,
            cfg.preflight_port,
            cfg.job_secret,
            timeout_s=timeout_s,
            connect_s=connect_s or timeout_s,
            rank=cfg.node_rank,
        )
    except WrongSecret as e:
        raise SecretMismatch(
            f"main {target} runs a job with another NODEKIT_JOB_SECRET than this node's; this node does not join. "
            "Every node needs the same secret: the same exported NODEKIT_JOB_SECRET, or the same "
            ".nodekit/job-secret copied with the project"
        ) from e
    except (NotNodekit, NoHandshake) as e:
        raise PreflightError(
            f"main {target} took the connection but completed no nodekit store handshake ({e}): an older nodekit "
            "on main (run the same image on every node: `nodekit push`), or its port is flooded"
        ) from e
    except StoreError as e:
        if connect_s is not None:
            raise PreflightError(
                f"main {target} ended the job before this node joined ({e}); see node 0's log for why, then restart "
                "every node"
            ) from e
        raise PreflightError(f"cannot reach main {target}: {e}") from e
