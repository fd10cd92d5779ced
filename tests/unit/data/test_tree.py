"""The pure parts of a dataset's relay tree (nodekit/data/tree.py): which host paths share one tree, what its one
stream carries (every content any of them lacks, once), what each node's receiver is told to read past, and what
the dry run shows."""

from __future__ import annotations

from pathlib import Path

from nodekit.data import tree
from nodekit.data.plan import HostPlan, NodeView, plan_host
from nodekit.data.push import Job, dry_run_text
from nodekit.data.transport import Where
from nodekit.ship.relay import RELAY_MIN_BYTES
from tests.unit.data.stand_ins import Ssh

BIG = RELAY_MIN_BYTES


WANT = {"a.bin": (10, "a" * 64), "b.bin": (20, "b" * 64), "shards/c.bin": (BIG, "c" * 64)}


def job(name: str, *, source: str = "/data", ssh: bool = True, root: str = "/srv/data") -> Job:
    return Job(Where(name, Ssh(name) if ssh else None), "/data", Path(source), root)


def plan(have: dict[str, tuple[int, str]] | None = None, want: dict[str, tuple[int, str]] | None = None) -> HostPlan:
    return plan_host(want or WANT, NodeView(owned=have or {}, foreign={}), where="x")


def test_one_tree_carries_every_content_any_host_lacks_once_smallest_first() -> None:
    jobs = [job("n1"), job("n2"), job("n3")]
    plans = [plan(), plan({"a.bin": WANT["a.bin"]}), plan({"moved.bin": WANT["shards/c.bin"]})]
    (t,) = tree.plan_trees(jobs, plans, "auto")
    assert t.members == (0, 1, 2) and t.source == Path("/data")
    assert list(t.stream) == ["a" * 64, "b" * 64, "c" * 64]  # a and c once, though two hosts lack each
    assert t.send_bytes == 30 + BIG
    # n3 holds c under another name: the stream carries c for the others, n3 reads it past and copies its own.
    mine = tree.node_plan(plans[2], t.stream)
    assert mine["incoming"] == {"a" * 64: 10, "b" * 64: 20} and mine["passing"] == {"c" * 64: BIG}
    assert mine["copy"] == {"c" * 64: "moved.bin"}


def test_a_tree_forms_only_where_it_pays() -> None:
    two = [job("n1"), job("n2")]
    small = {"a.bin": (10, "a" * 64)}
    assert tree.plan_trees(two, [plan(want=small), plan(want=small)], "auto") == []  # a few bytes: direct
    assert len(tree.plan_trees(two, [plan(want=small), plan(want=small)], "always")) == 1
    assert tree.plan_trees(two, [plan(), plan()], "never") == []
    assert tree.plan_trees([job("n1")], [plan()], "always") == []  # one host: nothing to relay to
    # Hosts with nothing to receive (up to date, or only copies and deletions) are pushed directly.
    assert tree.plan_trees(two, [plan(), plan(dict(WANT))], "always") == []


def test_only_ssh_hosts_one_path_each_and_one_tree_per_source() -> None:
    jobs = [job("here", ssh=False), job("n1"), job("n1", root="/other"), job("n2"), job("n3", source="/logs"),
            job("n4", source="/logs")]  # fmt: skip
    trees = tree.plan_trees(jobs, [plan() for _ in jobs], "always")
    assert [(t.source, t.members) for t in trees] == [(Path("/data"), (1, 3)), (Path("/logs"), (4, 5))]


def test_the_dry_run_shows_who_feeds_whom_and_one_copy_on_the_heads_link() -> None:
    jobs = [job(f"n{i}") for i in range(1, 5)]
    plans = [plan() for _ in jobs]
    text = dry_run_text(jobs, plans, "auto")
    # Up to CHAIN_MAX host paths a chain: each node's uplink carries one copy, the stream moves at a node's link.
    assert "  the head feeds n1\n  n1 feeds n2\n  n2 feeds n3\n  n3 feeds n4\n" in text, text
    assert "4 nodes, at most 1 fed by each, 4 hop(s) deep; 1 copy of the stream on the head's link" in text, text
    assert text.endswith(f"would send {30 + BIG} bytes in all"), text  # once, not four times
    assert dry_run_text(jobs, plans, "never").endswith(f"would send {4 * (30 + BIG)} bytes in all")


def test_beyond_the_chain_s_length_each_node_feeds_two_and_the_depth_grows_as_log_n() -> None:
    assert tree.shape_of(tree.CHAIN_MAX).height == tree.CHAIN_MAX and tree.shape_of(tree.CHAIN_MAX).fanout == 1
    wide = tree.shape_of(tree.CHAIN_MAX + 1)
    assert wide.fanout == 2 and wide.height == 4 and wide.head_copies == 1, wide
    assert tree.shape_of(512).height == 10  # hops from the head to the deepest node
    jobs = [job(f"n{i}") for i in range(1, tree.CHAIN_MAX + 2)]
    text = dry_run_text(jobs, [plan() for _ in jobs], "auto")
    assert "  the head feeds n1\n  n1 feeds n2, n3\n  n2 feeds n4, n5\n" in text, text


def test_the_last_line_says_how_many_paths_a_tree_fed_and_the_bytes_sent_once() -> None:
    from nodekit.data.push import Done, report_line

    jobs, p = [job(f"n{i}") for i in range(1, 4)], plan()
    done = [Done(jobs[0], p, 30 + BIG, "fed by the head"), Done(jobs[1], p, 0, "relayed by n1"),
            Done(jobs[2], p, 0, "relayed by n1")]  # fmt: skip
    assert report_line(done) == (
        f"dataset identical to the source on 3 host(s) (3 path(s), 2 relayed by other hosts); sent {30 + BIG} bytes"
    )


def test_a_file_source_is_pushed_directly_never_through_a_tree() -> None:
    """A tree node's receiver makes a whole directory equal to its plan: a file source's host path is one name in
    a directory that holds the user's other files, so it takes the direct push, which gives the receiver that name."""
    files = [Job(Where(n, Ssh(n)), "/data/tokens.bin", Path("/data/tokens.bin"), "/srv", "tokens.bin") for n in "ab"]
    assert tree.plan_trees(files, [plan(), plan()], "always") == []
    assert len(tree.plan_trees([job("a"), job("b")], [plan(), plan()], "always")) == 1


def test_the_hosts_a_failed_node_cut_off_are_fed_again_through_a_second_tree_and_one_alone_directly() -> None:
    """A tree's node died: the hosts below it are left unequal. Two or more of one source take a second tree of their
    own (about one more copy on the head's link, not one per host); a single one, one that no node can dial, and all
    of them after the second tree failed too, their own stream from the head. What arrived whole before the node
    died is not in the second tree's stream (their plans were made again from a scan after the first)."""
    jobs = [job(f"n{i}") for i in range(1, 6)]
    got_a = {"a.bin": WANT["a.bin"]}
    plans = [plan(), plan(got_a), plan(got_a), plan(), plan()]
    refeed = tree.plan_refeed(jobs, plans, [1, 2, 4], "always")
    (t,) = refeed.trees
    assert t.members == (1, 2, 4) and refeed.direct == ()
    assert list(t.stream) == ["a" * 64, "b" * 64, "c" * 64]  # n5 still lacks a.bin
    # a.bin arrived whole on n2 and n3 before the node above them died: their second tree does not carry it again.
    assert list(tree.plan_refeed(jobs, plans, [1, 2], "always").trees[0].stream) == ["b" * 64, "c" * 64]
    alone = tree.plan_refeed(jobs, plans, [3], "always")
    assert alone.trees == [] and alone.direct == (3,)
    assert tree.plan_refeed(jobs, plans, [1, 2, 4], "always", again=False) == tree.Refeed([], (1, 2, 4))
    undialled = tree.plan_refeed(jobs, plans, [1, 2, 4], "always", outside={4})
    assert [x.members for x in undialled.trees] == [(1, 2)] and undialled.direct == (4,)
    assert tree.plan_refeed(jobs, plans, [1, 2], "never") == tree.Refeed([], (1, 2))
    small = [plan(want={"a.bin": WANT["a.bin"]}) for _ in jobs]
    assert tree.plan_refeed(jobs, small, [1, 2], "auto").direct == (1, 2)  # a few bytes: two streams cost less


def test_each_host_fed_again_is_named_with_why_and_how() -> None:
    jobs = [job(f"n{i}") for i in range(1, 5)]
    plans = [plan() for _ in jobs]
    refeed = tree.plan_refeed(jobs, plans, [1, 2, 3], "always", outside={3})
    why = {1: "the stream from n1 stopped before it reached it", 2: "the stream from n1 stopped before it reached it",
           3: "not in the relay tree (no host key)"}  # fmt: skip
    assert tree.refeed_lines(jobs, refeed, why) == [
        "n2:/srv/data: the stream from n1 stopped before it reached it; sending it through a second relay tree "
        f"(2 host paths, {30 + BIG} bytes once on the head's link)",
        "n3:/srv/data: the stream from n1 stopped before it reached it; sending it through a second relay tree "
        f"(2 host paths, {30 + BIG} bytes once on the head's link)",
        "n4:/srv/data: not in the relay tree (no host key); sending it from the head",
    ]
    text = dry_run_text(jobs, plans, "always")
    assert "cuts off are fed again through a second tree (one alone: its own stream)" in text, text


def test_auto_builds_a_tree_where_the_copies_it_spares_outweigh_its_fixed_cost_so_more_hosts_need_less() -> None:
    """``auto`` weighs the copies a tree spares the head's link, (hosts - 1) x the stream, against its few seconds
    of fixed cost, for the least loss over a 100 Mbit/s to a 1 Gbit/s head link: about 108 MiB spared in all."""
    mib = 1 << 20
    assert not tree.tree_pays(2, 100 * mib) and tree.tree_pays(2, 110 * mib)
    assert not tree.tree_pays(3, 50 * mib) and tree.tree_pays(3, 55 * mib)
    assert not tree.tree_pays(9, 13 * mib) and tree.tree_pays(9, 14 * mib)
    want = {"x.bin": (60 * mib, "x" * 64)}
    assert tree.plan_trees([job("n1"), job("n2")], [plan(want=want), plan(want=want)], "auto") == []
    three = [job("n1"), job("n2"), job("n3")]
    assert len(tree.plan_trees(three, [plan(want=want) for _ in three], "auto")) == 1  # 120 MiB spared
