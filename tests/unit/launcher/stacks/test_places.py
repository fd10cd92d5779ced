"""Ranks grouped by where they wait (nodekit/launcher/stacks/places.py), on dumps captured from real runs (see
conftest.py) and on stacks built from their frames."""

from __future__ import annotations

import re
from dataclasses import replace

from nodekit.launcher.stacks.dump import Frame, Thread
from nodekit.launcher.stacks.places import (
    Place,
    RankStack,
    groups,
    library,
    missing,
    place,
    ranks_text,
    report,
    shown,
    summary,
)
from tests.factories import captured

SITE = "/opt/venv/lib/python3.11/site-packages"
# Where examples/ddp/stall.py issued its two collectives in the run the fixtures were captured from.
REDUCE_AT, GATHER_AT = 74, 77


def test_the_mismatched_collectives_of_a_real_run_are_named_with_both_places() -> None:
    stacks = captured("mismatch")
    reduce_at, gather_at = REDUCE_AT, GATHER_AT
    want = f"rank 0 in all_reduce at stall.py:{reduce_at}; rank 1 in all_gather at stall.py:{gather_at}"
    assert summary(stacks) == want
    text = report(stacks)
    assert text.startswith("2 rank(s) on 2 node(s), 2 place(s):\n")
    assert f'  File "stall.py", line {reduce_at}, in mismatch\n' in text
    assert '  File "torch/distributed/distributed_c10d.py", line ' in text  # site-packages shown from the package on
    assert re.search(r"rank 1 \(node 1, pid \d+\) in all_gather at stall\.py:\d+, most recent call last:", text)


def test_a_real_training_run_shows_every_rank_on_its_node() -> None:
    stacks = captured("training")
    assert sorted((s.rank, s.node) for s in stacks if s.rank is not None) == [(0, 0), (1, 1)]
    text = report(stacks)
    assert text.startswith("2 rank(s) on 2 node(s), ")
    assert all(p.file == "stall.py" for p in (place(s) for s in stacks if s.rank is not None)), text
    every = report(stacks, every=True)
    assert "hook.py" not in every  # nodekit's own progress thread is never shown


def as_rank(stack: RankStack, rank: int, node: int) -> RankStack:
    return replace(stack, rank=rank, node=node, pid=100 + rank)


def test_ranks_in_the_same_place_are_one_entry_and_the_odd_one_out_its_own() -> None:
    real = {s.rank: s for s in captured("mismatch")}
    four = [as_rank(real[1], 0, 0), as_rank(real[0], 1, 0), as_rank(real[1], 2, 1), as_rank(real[1], 3, 1)]
    found = groups(four)
    assert [g.ranks for g in found] == [[0, 2, 3], [1]]
    line = summary(four)
    assert re.fullmatch(r"ranks 0,2,3 in all_gather at stall\.py:\d+; rank 1 in all_reduce at stall\.py:\d+", line)
    text = report(four)
    assert "(the stack of rank 0; ranks 0,2,3 in all_gather" in text and text.count("most recent call last") == 2
    assert report(four, every=True).count("most recent call last") == 4


def frames(*spec: tuple[str, int, str]) -> tuple[Frame, ...]:
    """Frames given outermost first, stored innermost first as faulthandler prints them."""
    return tuple(Frame(f, n, fn) for f, n, fn in reversed(spec))


def stack(rank: int, *spec: tuple[str, int, str], world: int | None = None) -> RankStack:
    main = Thread(1, True, None, frames(*spec))
    return RankStack(pid=10 + rank, rank=rank, node=0, main=main, threads=(main,), world=world)


def test_the_operation_is_the_torch_call_the_users_line_makes() -> None:
    backward = stack(
        1,
        ("/workspace/train.py", 90, "<module>"),
        ("/workspace/train.py", 61, "main"),
        (f"{SITE}/torch/_tensor.py", 625, "backward"),
        (f"{SITE}/torch/autograd/__init__.py", 354, "backward"),
        (f"{SITE}/torch/autograd/graph.py", 841, "_engine_run_backward"),
    )
    gather_object = stack(
        0,
        ("/workspace/train.py", 90, "<module>"),
        ("/workspace/train.py", 88, "main"),
        (f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", 3100, "all_gather_object"),
        (f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper"),
        (f"{SITE}/torch/distributed/distributed_c10d.py", 4287, "all_gather"),
    )
    sleeping = stack(2, ("/workspace/train.py", 90, "<module>"), ("/workspace/train.py", 70, "evaluate"))
    in_queue = stack(
        3,
        ("/workspace/pkg/train.py", 90, "<module>"),
        ("/workspace/pkg/data.py", 12, "next_batch"),
        ("/usr/lib/python3.11/queue.py", 180, "get"),
        ("/usr/lib/python3.11/threading.py", 320, "wait"),
    )
    assert place(backward) == Place("backward", "train.py", 61, "main")
    assert place(gather_object) == Place("all_gather_object", "train.py", 88, "main")
    assert place(sleeping) == Place(None, "train.py", 70, "evaluate")
    assert place(in_queue) == Place(None, "pkg/data.py", 12, "next_batch")
    assert summary([backward, gather_object, sleeping, in_queue]) == (
        "rank 0 in all_gather_object at train.py:88; rank 1 in backward at train.py:61; "
        "rank 2 at train.py:70 in evaluate; rank 3 at pkg/data.py:12 in next_batch"
    )


def test_ranks_found_nowhere_and_processes_without_a_stack_are_said() -> None:
    one = stack(0, ("/workspace/train.py", 9, "<module>"), world=4)
    broken = RankStack(pid=77, rank=2, node=1, main=None, world=4, error="no stack within 3 s")
    helper = RankStack(pid=78, rank=None, node=1, main=None, command="python -c from multiprocessing.spawn ...")
    assert missing([one, broken, helper]) == [1, 3]
    assert summary([one, broken, helper]) == (
        "rank 0 at train.py:9 in <module>; rank 2 without a stack (no stack within 3 s); "
        "ranks 1,3 not found on any node"
    )
    text = report([one, broken, helper])
    assert text.startswith("2 rank(s) on 2 node(s), 2 place(s); ranks 1,3 not found:")
    assert "(1 other Python process(es) of the job, not ranks, not shown)" in text
    assert "pid 78 (not a rank: python -c from multiprocessing.spawn ...)" in report([one, helper], every=True)
    assert summary([]) == "no rank found"


def test_rank_lists_are_short_and_files_are_shown_from_the_project_or_the_package() -> None:
    assert ranks_text([3, 0, 2]) == "0,2,3"
    assert ranks_text([*range(64), 70, 71]) == "0-63,70,71"
    assert ranks_text([5, 5]) == "5"
    files = (
        "/workspace/train.py",
        "<string>",
        "<frozen runpy>",
        f"{SITE}/torch/x.py",
        "/usr/lib/python3.11/threading.py",
        "/opt/nodekit/nodekit/launcher/main.py",
        "/home/me/code/train.py",
    )
    assert [library(f) for f in files] == [False, False, True, True, True, True, False]
    assert shown("/workspace/pkg/train.py") == "pkg/train.py"
    assert shown(f"{SITE}/torch/_tensor.py") == "torch/_tensor.py"
    assert shown("/home/me/train.py") == "/home/me/train.py"
