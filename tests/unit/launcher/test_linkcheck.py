"""The link check: the schedule, the verdict (pure), and real measurements over loopback between threads, each a
node with its own address (127.0.0.x), through a real preflight store with the job secret."""

from __future__ import annotations

import socket
import threading
from dataclasses import replace
from itertools import combinations

import pytest

from nodekit.launcher.linkcheck import listener, probe
from nodekit.launcher.linkcheck.rounds import estimate_s, partner, rounds
from nodekit.launcher.linkcheck.run import LinkJob, run
from nodekit.launcher.linkcheck.verdict import (
    Endpoint,
    LinkVerdict,
    Pair,
    Transfer,
    decide,
    render,
    upper_quartile,
)
from nodekit.launcher.store.client import Client
from nodekit.launcher.store.server import host
from tests.factories import Front

SECRET = "job-secret-for-the-link-check"


@pytest.mark.parametrize("n", range(2, 18))
def test_every_pair_meets_once_and_no_node_is_in_two_pairs_of_a_round(n: int) -> None:
    sched = rounds(n)
    assert len(sched) == (n - 1 if n % 2 == 0 else n)
    met = [p for r in sched for p in r]
    assert sorted(met) == list(combinations(range(n), 2))
    for r in sched:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
        assert all(a < b for a, b in r)
    assert partner(sched, 0, 0) is not None or n % 2 == 1


def test_the_cost_bound_is_rounds_times_both_directions() -> None:
    assert [round(estimate_s(n), 2) for n in (2, 4, 8, 16)] == [0.5, 1.5, 3.5, 7.5]


def gbit(g: float, seconds: float = 0.2) -> Transfer:
    return Transfer(bytes=int(g * 1e9 / 8 * seconds), seconds=seconds)


def ends(n: int) -> list[Endpoint]:
    ifaces = ["net0", "eth1", "ens5", "net0"]
    return [Endpoint(r, f"h{r}", f"172.31.250.{10 + r}", ifaces[r % 4], 40000 + r) for r in range(n)]


def pairs(n: int, slow: int | None = None, slow_gbit: float = 0.05, fast: float = 9.4) -> list[Pair]:
    out = []
    for a, b in combinations(range(n), 2):
        g = slow_gbit if slow in (a, b) else fast
        out.append(Pair(a, b, gbit(g), gbit(g * 1.02), rtt_ms=0.08 if slow not in (a, b) else 2.5))
    return out


def test_a_slow_node_is_named_in_each_of_its_pairs_with_interfaces_and_figures() -> None:
    v = decide(ends(4), pairs(4, slow=3), seconds=0.2, took_s=1.4)
    assert [(f.kind, f.a, f.b, f.refuse) for f in v.findings] == [
        ("slow", 0, 3, False), ("slow", 1, 3, False), ("slow", 2, 3, False),
    ]  # fmt: skip
    assert v.suspects == (3,) and not v.refused and v.reference_gbit == pytest.approx(9.4, rel=0.03)
    text = render(v, matrix=True)
    assert text.splitlines()[0].startswith("nodekit link check: WARNING, 3 pair(s) named")
    assert "likely cause: node 3 (h3, 172.31.250.13, net0)" in text
    assert "node 1 (h1, 172.31.250.11, eth1) <-> node 3 (h3, 172.31.250.13, net0): 0.05 Gbit/s 1->3" in text
    assert "`ethtool net0`" in text and "`tc qdisc show dev net0`" in text
    assert "0.05*" in text and "9.40" in text  # the matrix marks the named pairs


def test_a_healthy_cluster_passes_and_small_noise_is_not_a_finding() -> None:
    ps = [
        Pair(a, b, gbit(9.4 * (0.7 + 0.1 * a)), gbit(9.0), rtt_ms=0.1 + 0.05 * b) for a, b in combinations(range(4), 2)
    ]
    v = decide(ends(4), ps, seconds=0.2, took_s=1.4)
    assert v.findings == () and v.suspects == ()
    assert render(v, matrix=False).startswith("nodekit link check: ok, 4 nodes, 6 pair(s)")


def test_refusals_floor_unreachable_and_refuse_mode() -> None:
    floor = decide(ends(2), [Pair(0, 1, gbit(0.9), gbit(0.95), rtt_ms=0.2)], min_gbit=1.0)
    assert [(f.kind, f.refuse) for f in floor.findings] == [("below_floor", True)] and floor.refused
    assert "below min_link_gbit = 1" in floor.findings[0].text
    assert "(exit 20)" in render(floor, matrix=False).splitlines()[0]
    two = decide(ends(2), [Pair(0, 1, gbit(0.9), gbit(0.95))])
    assert two.findings == ()  # one pair has no others to be compared with
    cut = decide(ends(3), [*pairs(3)[:2], Pair(1, 2, Transfer(), Transfer(), error="cannot connect: timed out")])
    assert [(f.kind, f.a, f.b, f.refuse) for f in cut.findings] == [("unreachable", 1, 2, True)]
    strict = decide(ends(4), pairs(4, slow=3), mode="refuse")
    assert strict.refused and all(f.refuse for f in strict.findings)


def test_a_late_pair_is_named_by_its_round_trip() -> None:
    ps = [
        Pair(a, b, gbit(9.4), gbit(9.4), rtt_ms=6.0 if (a, b) == (0, 1) else 0.1) for a, b in combinations(range(4), 2)
    ]
    v = decide(ends(4), ps)
    assert [(f.kind, f.a, f.b) for f in v.findings] == [("late", 0, 1)]
    # the fix names the path, and a host whose cores are all taken: the scheduler delays every answer too
    fix = render(v, matrix=False).splitlines()[-1]
    assert "`ethtool`" in fix and "cores are all taken" in fix and "`top` on both ends" in fix
    slow = render(decide(ends(4), pairs(4, slow=2)), matrix=False)
    assert "likely cause" in slow and "cores are all taken" in slow
    floor = render(decide(ends(2), [Pair(0, 1, gbit(0.9), gbit(0.95), rtt_ms=0.2)], min_gbit=1.0), matrix=False)
    assert "min_link_gbit" in floor and "cores are all taken" not in floor


def test_a_named_pair_whose_ends_held_its_pings_says_how_long_as_read() -> None:
    """A slow pair whose ends waited for a core at every ping (the round trip as read 12 ms, the path's 0.05 ms)
    shows both figures: the evidence for the busy host the fix line names. Ends that held nothing show one."""
    held = [
        Pair(a, b, gbit(0.5 if (a, b) == (0, 1) else 9.4), gbit(9.4), rtt_ms=0.05, read_rtt_ms=12.0 if a == 0 else 0.1)
        for a, b in combinations(range(4), 2)
    ]
    line = next(f.text for f in decide(ends(4), held).findings)
    assert "rtt 0.05 ms (12.00 ms as its ends read it: they waited for a core)" in line, line
    quiet = [replace(p, read_rtt_ms=0.1) for p in held]
    line = next(f.text for f in decide(ends(4), quiet).findings)
    assert line.endswith("rtt 0.05 ms, under 0.25 x the others' 9.40 Gbit/s"), line


def test_the_reference_is_the_upper_quartile() -> None:
    assert upper_quartile([1, 2, 3, 4]) == 3 and upper_quartile([0.05, 0.05, 0.05, 9, 9, 9]) == 9
    assert upper_quartile([5.0]) == 5.0


def test_the_verdict_round_trips_through_json() -> None:
    v = decide(ends(4), pairs(4, slow=2), seconds=0.2, took_s=1.0)
    assert LinkVerdict.from_json(v.to_json()) == v


# ---- real sockets -----------------------------------------------------------------------------------------------


def nodes(n: int, seconds: float = 0.05) -> dict[int, LinkVerdict]:
    hosted = host(SECRET, 0, timeout_s=30, host="127.0.0.1")
    out: dict[int, LinkVerdict] = {}
    errors: list[BaseException] = []

    def node(r: int) -> None:
        try:
            store = hosted if r == 0 else Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=30, connect_s=5)
            job = LinkJob(r, n, f"h{r}", f"127.0.0.{r + 1}", "lo", SECRET, seconds=seconds)
            out[r] = run(store, job, hosted.run_id)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    hosted.close()
    assert not errors, errors
    return out


def test_three_nodes_measure_every_pair_both_ways_and_agree_on_the_verdict() -> None:
    out = nodes(3)
    assert out[0] == out[1] == out[2]
    v = out[0]
    assert [(p.a, p.b) for p in v.pairs] == [(0, 1), (0, 2), (1, 2)]
    for p in v.pairs:
        assert p.error == "" and p.ab.gbit and p.ba.gbit and p.rtt_ms is not None and p.rtt_ms > 0
    assert [e.addr for e in v.endpoints] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert not v.refused


def test_the_listener_admits_only_the_job_secret_and_survives_strangers() -> None:
    server = listener.LinkServer(SECRET, b"r" * 16, "127.0.0.1").start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n".ljust(36, b"x"))  # a hello's size, not a hello: dropped unanswered
            assert s.recv(100) == b""
        wrong = probe.measure(0, 1, "127.0.0.1", server.port, "another-secret", b"r" * 16, 0.05)
        assert wrong.error and wrong.gbit is None
        other_run = probe.measure(0, 1, "127.0.0.1", server.port, SECRET, b"x" * 16, 0.05)
        assert "another run" in other_run.error
        good = probe.measure(0, 1, "127.0.0.1", server.port, SECRET, b"r" * 16, 0.05)
        assert good.error == "" and good.gbit is not None and good.gbit > 0
    finally:
        server.close()


def _feed(rates_gbit: list[float], window: float = probe.WINDOW_S) -> tuple[float, float] | None:
    """When :class:`probe.Steady` settles (seconds since the first byte) on a receiver counting bytes every
    millisecond at the given rate per window, with the figure then (Gbit/s, first byte to last); None when it never
    does."""
    steady = probe.Steady(0.0)
    t, step = 0.0, 0.001
    for gbit in rates_gbit:
        for _ in range(round(window / step)):
            t += step
            if steady.add(round(gbit * 1e9 / 8 * step), t):
                return t, steady.total * 8 / t / 1e9
    return None


def test_a_figure_that_holds_settles_after_the_minimum_and_one_that_climbs_or_falls_does_not() -> None:
    settled = _feed([10.0] * 10)
    assert settled is not None and probe.STEADY_MIN_S <= settled[0] <= probe.STEADY_MIN_S + 2 * probe.WINDOW_S
    assert settled[1] == pytest.approx(10.0, rel=0.01)
    # Slow start on a long path: the rate doubles window after window, and the transfer runs to its bound.
    assert _feed([0.1 * 2**i for i in range(10)]) is None
    # A stall: the figure falls window after window.
    assert _feed([10.0] * 2 + [0.0] * 5) is None
    # A link shared with bursts of other traffic: its average settles, and that average is the figure.
    bursty = _feed([10.0, 4.0] * 10)
    assert bursty is not None and bursty[1] == pytest.approx(7.0, rel=0.1)
    # A ramp, then a plateau: not settled while the figure still climbs.
    ramp = _feed([0.5, 1.0, 2.0, 4.0, 8.0] + [10.0] * 20)
    assert ramp is not None and ramp[0] > 8 * probe.WINDOW_S


def test_a_pair_on_a_settled_link_ends_each_way_long_before_its_bound() -> None:
    import time

    server = listener.LinkServer(SECRET, b"r" * 16, "127.0.0.1").start()
    try:
        t0 = time.monotonic()
        pair = probe.measure(0, 1, "127.0.0.1", server.port, SECRET, b"r" * 16, 5.0)
        took = time.monotonic() - t0
        assert pair.error == "" and pair.ab.gbit and pair.ba.gbit
        # Both directions told their sender to stop: the listener (it counts a->b) and this side (b->a); each
        # would otherwise send for 5 s.
        assert pair.ab.seconds < 2.0 and pair.ba.seconds < 2.0 and took < 4.0, (pair, took)
        # The connection of each direction closed cleanly: the listener serves the next pair at once.
        again = probe.measure(0, 1, "127.0.0.1", server.port, SECRET, b"r" * 16, 0.05)
        assert again.error == "" and again.gbit
    finally:
        server.close()


@pytest.mark.parametrize(
    ("where", "stalled", "late"),
    [
        ("listener", (1, 2, 3), False),  # some answers wait for a core: the least is the path's
        ("listener", (0, 1, 2, 3, 4), False),  # every answer waits for a core: the listener's hold is taken out
        ("client", (0, 1, 2, 3, 4), False),  # every answer is read late: its kernel's time of receipt counts
        ("path", (0, 1, 2, 3, 4), True),  # the path itself holds every frame: late
    ],
)
def test_a_round_trip_is_the_paths_own_a_busy_end_is_not_late_a_slow_path_is(
    monkeypatch: pytest.MonkeyPatch, where: str, stalled: tuple[int, ...], late: bool
) -> None:
    """30 ms added to a ping's round trip, where it happens: at the listener between its kernel's receipt and its
    process's read (a thread woken late on a busy core, a container waiting for its cpu cgroup's turn), at the
    connecting node between the answer's receipt and its read, or on the path (a relay that holds every chunk
    15 ms each way). By the verdict's rule (over 4 x the others' and 5 ms more) only the path is late; the round
    trip as the processes read it carries every stall."""
    import select
    import time

    answered: list[int] = []
    recv_stamped = probe.Channel.recv_stamped

    def stalling(channel: probe.Channel) -> tuple[bytes, float]:
        # The listener's reads: its request, then the pings; the connecting node's: the answers, then the result.
        on_listener = channel.out == probe.TO_CLIENT
        ping = channel.rseq - 1 if on_listener else channel.rseq
        if 0 <= ping < probe.PINGS and on_listener == (where == "listener"):
            if where in ("listener", "client") and ping in stalled:
                select.select([channel.sock], [], [], 10)  # the frame has arrived (the listener may be early)
                time.sleep(0.03)  # and the process reads it late
            answered.append(ping)
        return recv_stamped(channel)

    monkeypatch.setattr(probe.Channel, "recv_stamped", stalling)
    server = listener.LinkServer(SECRET, b"r" * 16, "127.0.0.1").start()
    relay = Front(server.port, delay_s=0.015) if where == "path" else None
    try:
        port = relay.port if relay else server.port
        pair = probe.measure(0, 1, "127.0.0.1", port, SECRET, b"r" * 16, 0.05)
    finally:
        server.close()
        if relay:
            relay.close()
    if where != "path":
        assert answered == list(range(probe.PINGS))
    assert pair.error == "" and pair.rtt_ms is not None and pair.read_rtt_ms is not None, pair
    assert (pair.rtt_ms >= 30) is late, pair
    assert pair.read_rtt_ms >= (30 if len(stalled) == probe.PINGS else 0), pair
    others = [Pair(a, b, gbit(9.4), gbit(9.4), rtt_ms=0.1) for a, b in combinations(range(4), 2) if (a, b) != (0, 1)]
    v = decide(ends(4), [replace(pair, ab=gbit(9.4), ba=gbit(9.4)), *others])
    assert [(f.kind, f.a, f.b) for f in v.findings] == ([("late", 0, 1)] if late else [])


def test_a_frame_s_time_is_when_its_kernel_received_it_not_when_it_was_read() -> None:
    """The clock the pings are timed by: a frame read 50 ms after it arrived is stamped with its arrival."""
    import time

    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    with a, b:
        probe.stamp_arrivals(b)
        deadline = time.monotonic() + 10
        while True:  # the kernel turns its clock on a moment after the first socket asks (a deferred work item)
            a.sendall(b"w")
            time.sleep(0.01)
            _data, ancillary, _flags, _addr = b.recvmsg(16, socket.CMSG_SPACE(16))
            if probe._stamp(ancillary) is not None:
                break
            assert time.monotonic() < deadline, "the kernel stamped no frame in 10 s"
        a.sendall(b"x" * 32)
        sent = time.time()
        time.sleep(0.05)
        data, arrived = probe._recv_exact_stamped(b, 32)
        assert data == b"x" * 32
        # stamped as the frame arrived (on loopback, within the send), not 50 ms later when it was read
        assert arrived < sent + 0.025 and time.time() - arrived >= 0.05, (arrived - sent, time.time() - arrived)


def test_closing_the_listener_wakes_its_accept_loop_instead_of_sleeping_out_its_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    monkeypatch.setattr(listener, "ACCEPT_POLL_S", 30.0)  # a poll this long would hold close() for 30 s
    server = listener.LinkServer(SECRET, b"r" * 16, "127.0.0.1").start()
    t0 = time.monotonic()
    server.close()
    assert not server._thread.is_alive() and time.monotonic() - t0 < 10


def test_nobody_listening_is_a_pair_that_cannot_connect() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pair = probe.measure(0, 1, "127.0.0.1", port, SECRET, b"r" * 16, 0.05)
    assert "cannot connect" in pair.error and "refused" in pair.error.lower()


def test_each_node_listens_where_it_is_reached_and_main_behind_a_translation_listens_anywhere() -> None:
    from dataclasses import replace

    from nodekit.launcher.checks import link_job
    from nodekit.launcher.config import parse_env
    from nodekit.launcher.preflight.stack import StackReport
    from tests.factories import node_env

    facts = StackReport.from_json_dict({"rank": 1, "hostname": "n1", "address": "127.0.0.1"})
    worker = link_job(parse_env({**node_env(1), "MASTER_ADDR": "127.0.0.1"}), facts)
    assert (worker.addr, worker.iface, worker.bind) == ("127.0.0.1", "lo", None)
    main = link_job(parse_env({**node_env(0), "MASTER_ADDR": "203.0.113.9"}), replace(facts, rank=0))
    assert (main.addr, main.bind, main.rank) == ("203.0.113.9", "", 0)  # reached there, listens on every address
    pinned = link_job(parse_env({**node_env(1), "GLOO_SOCKET_IFNAME": "lo"}), facts)
    assert (pinned.addr, pinned.iface) == ("127.0.0.1", "lo")


# ---- beside the job's start (links = "warn") --------------------------------------------------------------------


def beside_env(rank: int, **extra: str) -> dict[str, str]:
    from tests.factories import node_env

    return {**node_env(rank), "MASTER_ADDR": "127.0.0.1", "NODEKIT_JOB_SECRET": SECRET,
            "NODEKIT_LINK_SECONDS": "0.05", **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "stays", "beside"),
    [({}, True, True), ({}, False, False), ({"NODEKIT_LINK_CHECK": "refuse"}, True, False),
     ({"NODEKIT_MIN_LINK_GBIT": "5"}, True, False), ({"NODEKIT_CHECKS_ONLY": "1"}, True, False)],
)  # fmt: skip
def test_only_a_check_nothing_waits_for_runs_beside_the_job(extra: dict[str, str], stays: bool, beside: bool) -> None:
    from nodekit.launcher.checks import links_beside_job
    from nodekit.launcher.config import parse_env

    assert links_beside_job(parse_env(beside_env(1, **extra)), stays) is beside


def test_the_check_beside_the_job_returns_at_once_and_its_verdict_follows_before_the_node_is_done(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each node starts the check in a thread and goes on at once (to torchrun, in the launcher); the check's rounds
    run meanwhile; the peer watchdog's finish waits for it (settle), so the store outlives it."""
    from nodekit.launcher.checks import LinksBeside
    from nodekit.launcher.config import parse_env
    from nodekit.launcher.preflight.stack import StackReport
    from nodekit.launcher.watchdog.run import Watchdog

    hosted = host(SECRET, 0, timeout_s=30, host="127.0.0.1")
    client = Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=30, connect_s=5)
    stores = {0: hosted, 1: client}
    besides = {}
    for r in (0, 1):
        me = StackReport.from_json_dict({"rank": r, "hostname": f"n{r}", "address": "127.0.0.1"})
        besides[r] = LinksBeside(parse_env(beside_env(r)), stores[r], me)
        assert besides[r].verdict is None  # returned before its first transfer (2 x 0.05 s) could end
    names = {0: "127.0.0.1, host n0", 1: "127.0.0.1, host n1"}
    dogs = {r: Watchdog(stores[r], r, 2, 30.0, names, stop=lambda: None, beat_s=0.05, judge_s=0.02,
                        settle=besides[r].wait) for r in (0, 1)}  # fmt: skip
    threads = [threading.Thread(target=dogs[r].finish, args=(0,)) for r in (0, 1)]
    for r, t in enumerate(threads):
        dogs[r].start()
        t.start()
    for t in threads:
        t.join(30)
    hosted.close()
    assert not any(t.is_alive() for t in threads)
    v0, v1 = besides[0].verdict, besides[1].verdict
    assert v0 is not None and v0 == v1 and not v0.refused
    (pair,) = v0.pairs
    assert pair.error == "" and pair.ab.gbit and pair.ba.gbit
    out = capsys.readouterr()
    assert out.out.count("nodekit link check: running beside the job's start") == 2
    assert out.out.count("nodekit link check: ok, 2 nodes, 1 pair(s)") == 2, out.out
    assert "Traceback" not in out.err


def test_a_check_beside_the_job_that_loses_the_store_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from nodekit.launcher.checks import LinksBeside
    from nodekit.launcher.config import parse_env
    from nodekit.launcher.preflight.stack import StackReport

    hosted = host(SECRET, 0, timeout_s=30, host="127.0.0.1")
    client = Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=30, connect_s=5)
    hosted.close()  # main's store is gone (the job ended there) before this node's check asks anything
    me = StackReport.from_json_dict({"rank": 1, "hostname": "n1", "address": "127.0.0.1"})
    beside = LinksBeside(parse_env(beside_env(1)), client, me)
    beside.wait()
    assert beside.verdict is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nodekit link check: not finished: lost main's store"), err
    assert '(links = "warn": the job goes on)' in err


def test_a_refusal_beside_the_job_stops_every_node_through_its_watchdog_and_each_exits_20(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A verdict that refuses (here a floor no link reaches; in warn mode, a pair that cannot connect) after the job
    started: each node's watchdog stops its job (the stop callback, torchrun's SIGTERM in the launcher), and the
    node, whose torchrun then ends non-zero, exits 20 with the line."""
    from nodekit.launcher.checks import LinksBeside
    from nodekit.launcher.config import parse_env
    from nodekit.launcher.contract import EXIT_LINK
    from nodekit.launcher.preflight.stack import StackReport
    from nodekit.launcher.watchdog.run import Watchdog

    hosted = host(SECRET, 0, timeout_s=30, host="127.0.0.1")
    stores = {0: hosted, 1: Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=30, connect_s=5)}
    names = {0: "127.0.0.1, host n0", 1: "127.0.0.1, host n1"}
    stopped = {r: threading.Event() for r in (0, 1)}
    dogs, besides = {}, {}
    for r in (0, 1):
        me = StackReport.from_json_dict({"rank": r, "hostname": f"n{r}", "address": "127.0.0.1"})
        besides[r] = LinksBeside(parse_env(beside_env(r, NODEKIT_MIN_LINK_GBIT="1000000")), stores[r], me)
        dogs[r] = Watchdog(stores[r], r, 2, 30.0, names, stop=stopped[r].set, beat_s=0.05, judge_s=0.02,
                           settle=besides[r].wait)  # fmt: skip
        besides[r].attach(dogs[r].refuse)
        dogs[r].start()
    for r in (0, 1):
        assert stopped[r].wait(20), f"node {r}'s job was not stopped"
    endings: dict[int, int] = {}

    def finish(r: int) -> None:
        endings[r] = dogs[r].finish(143).code  # torchrun, stopped by the watchdog's SIGTERM

    threads = [threading.Thread(target=finish, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    hosted.close()
    assert endings == {0: EXIT_LINK, 1: EXIT_LINK}
    err = capsys.readouterr().err
    assert err.count("nodekit link check: REFUSED, 1 pair(s) named: every node stops its job (exit 20)") == 2, err
    assert err.count(f"nodekit: the link check refused this job; stopping this node (exit {EXIT_LINK})") == 2, err


def test_a_refusal_known_before_the_watchdog_is_attached_is_delivered_on_attach() -> None:
    from nodekit.launcher.checks import LinksBeside
    from nodekit.launcher.config import parse_env
    from nodekit.launcher.preflight.stack import StackReport

    hosted = host(SECRET, 0, timeout_s=30, host="127.0.0.1")
    stores = {0: hosted, 1: Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=30, connect_s=5)}
    besides = [LinksBeside(parse_env(beside_env(r, NODEKIT_MIN_LINK_GBIT="1000000")), stores[r],
                           StackReport.from_json_dict({"rank": r, "hostname": f"n{r}", "address": "127.0.0.1"}))
               for r in (0, 1)]  # fmt: skip
    for b in besides:
        b.wait()
    hosted.close()
    got: list[str] = []
    besides[1].attach(got.append)
    assert besides[1].verdict is not None and besides[1].verdict.refused
    assert got == ["nodekit: the link check refused this job; stopping this node (exit 20)"]
