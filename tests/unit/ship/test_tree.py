"""The relay tree's planning (nodekit/ship/tree.py), pure: its shape, depth and fan-out bound at sizes up to 512,
the head's single copy, what a failed node cuts off, and what a dry run prints of it."""

from __future__ import annotations

import math

import pytest

from nodekit.ship.tree import FANOUT, Tree, cut_off, plan_tree, shape_lines


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 17, 64, 100, 512])
def test_every_node_is_fed_once_by_one_before_it_at_most_fanout_each_log_deep(n: int) -> None:
    tree = plan_tree(n)
    assert len(tree) == n
    assert tree.parent[0] is None and tree.head_copies == 1  # the head's link: one copy, whatever n is
    assert all(p is not None and p < i for i, p in enumerate(tree.parent) if i)  # a feeder comes first
    assert tree.fanout <= FANOUT
    assert tree.height == math.floor(math.log2(n)) + 1  # as shallow as a fan-out of two allows
    everyone = [0, *tree.below(0)]
    assert sorted(everyone) == list(range(n))  # each node reached, and once


def test_the_fanout_is_two_and_sixteen_nodes_are_five_hops_deep_and_512_ten() -> None:
    assert FANOUT == 2
    assert plan_tree(16).height == 5 and plan_tree(512).height == 10
    assert plan_tree(4).parent == (None, 0, 0, 1)  # the cluster test's shape: h1 feeds h2 and h3, h2 feeds h4


def test_a_chain_is_the_tree_with_a_fanout_of_one() -> None:
    chain = plan_tree(5, fanout=1)
    assert chain.parent == (None, 0, 1, 2, 3) and chain.height == 5 and chain.fanout == 1
    assert plan_tree(10, fanout=3).fanout == 3 and plan_tree(10, fanout=3).height == 3
    assert plan_tree(0) == Tree(()) and plan_tree(0).height == 0


def test_a_failed_node_cuts_off_only_its_own_subtree() -> None:
    tree = plan_tree(15)  # 0 feeds 1, 2; 1 feeds 3, 4; 3 feeds 7, 8; 4 feeds 9, 10 ...
    assert tree.below(1) == [3, 4, 7, 8, 9, 10]
    assert cut_off(tree, [1]) == {3: 1, 4: 1, 7: 1, 8: 1, 9: 1, 10: 1}  # 2's side goes on
    # The stream stopped at 1, so 3 and the rest of its subtree failed too: each is named as cut off by 1, the
    # highest failure above it, not by its own feeder.
    assert cut_off(tree, [1, 3, 4, 7, 8, 9, 10]) == {3: 1, 4: 1, 7: 1, 8: 1, 9: 1, 10: 1}
    assert cut_off(tree, [7, 14]) == {}  # leaves cut nobody
    assert cut_off(tree, [0]) == {i: 0 for i in range(1, 15)}
    assert cut_off(tree, [2, 12]) == {5: 2, 6: 2, 11: 2, 12: 2, 13: 2, 14: 2}


def test_the_dry_run_says_who_feeds_whom_and_the_copies_on_the_heads_link() -> None:
    names = [f"h{i}" for i in range(1, 5)]
    assert shape_lines(names, plan_tree(4)) == [
        "  the head feeds h1",
        "  h1 feeds h2, h3",
        "  h2 feeds h4",
        "  4 nodes, at most 2 fed by each, 3 hop(s) deep; 1 copy of the stream on the head's link",
    ]
    lines = shape_lines([f"n{i}" for i in range(512)], plan_tree(512))
    assert len(lines) == 2 + 256 and lines[-1].endswith("10 hop(s) deep; 1 copy of the stream on the head's link")
    assert shape_lines([], plan_tree(0)) == []
