"""The pure plan: only contents a host lacks travel, once; a rename is a copy on the node; only names nodekit wrote
are deleted; a file nodekit did not write is adopted when it is the source's, else the host is refused."""

from __future__ import annotations

import pytest

from nodekit.data.plan import HostPlan, NodeView, NoRoom, TargetNotEmpty, plan_host, room_problem, summary

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_an_empty_host_gets_every_content_once() -> None:
    want = {"x/1.bin": (10, A), "x/2.bin": (10, A), "y.bin": (5, B)}
    p = plan_host(want, NodeView({}, {}), where="h")
    assert p.incoming == {A: 10, B: 5} and p.send_bytes == 15
    assert p.place == {"x/1.bin": A, "x/2.bin": A, "y.bin": B}
    assert p.delete == () and p.copy == {} and p.adopt == ()


def test_no_change_sends_nothing_and_changes_nothing() -> None:
    want = {"a": (10, A), "b": (5, B)}
    p = plan_host(want, NodeView(dict(want), {}), where="h")
    assert not p.changes and p.send_bytes == 0 and summary(p) == "up to date: nothing to send"


def test_a_rename_or_move_is_a_copy_on_the_node_and_the_old_name_is_deleted() -> None:
    p = plan_host({"new/place.bin": (10, A)}, NodeView({"old.bin": (10, A)}, {}), where="h")
    assert p.incoming == {} and p.copy == {A: "old.bin"}
    assert p.place == {"new/place.bin": A} and p.delete == ("old.bin",)


def test_a_one_file_change_sends_that_file_only() -> None:
    node = NodeView({"a": (10, A), "b": (5, B)}, {})
    p = plan_host({"a": (10, A), "b": (7, C)}, node, where="h")
    assert p.incoming == {C: 7} and p.place == {"b": C} and p.delete == ()


def test_a_damaged_copy_is_repaired_from_a_twin_on_the_node_or_sent_again() -> None:
    node = NodeView({"a": (10, C), "twin": (10, A), "b": (3, C)}, {})  # "a" damaged, "b" truncated
    p = plan_host({"a": (10, A), "twin": (10, A), "b": (5, B)}, node, where="h")
    assert p.copy == {A: "twin"} and p.incoming == {B: 5} and set(p.place) == {"a", "b"}


def test_contents_a_killed_push_left_in_staging_are_not_sent_again() -> None:
    p = plan_host({"a": (10, A), "b": (5, B)}, NodeView({}, {}, staged={A: 10}), where="h")
    assert p.incoming == {B: 5} and p.place == {"a": A, "b": B}


def test_files_nodekit_did_not_write_are_never_deleted_or_overwritten() -> None:
    foreign = {"notes.txt": [4, "f"]}
    with pytest.raises(TargetNotEmpty) as e:
        plan_host({"a": (10, A)}, NodeView({}, foreign), where="node 1 (h1):/data")
    assert "node 1 (h1):/data holds 1 file(s) nodekit did not put there" in e.value.one_line()
    assert "notes.txt" in e.value.one_line() and e.value.exit_code == 2
    same_name_other_content = {"a": [10, "f", B]}
    with pytest.raises(TargetNotEmpty):
        plan_host({"a": (10, A)}, NodeView({}, same_name_other_content), where="h")
    a_link = {"a": [10, "l"]}
    with pytest.raises(TargetNotEmpty):
        plan_host({"a": (10, A)}, NodeView({}, a_link), where="h")


def test_a_file_already_there_identical_to_the_source_is_adopted_not_sent() -> None:
    p = plan_host({"a": (10, A), "b": (5, B)}, NodeView({}, {"a": [10, "f", A]}), where="h")
    assert p.adopt == ("a",) and "a" not in p.place and p.incoming == {B: 5}
    assert "a" not in p.delete


def test_deletions_are_only_of_names_nodekit_wrote() -> None:
    p = plan_host({}, NodeView({"gone": (1, A)}, {}), where="h")
    assert p.delete == ("gone",)
    for plan in (p, plan_host({"a": (1, A)}, NodeView({}, {"a": [1, "f", A]}), where="h")):
        assert set(plan.delete) <= {"gone"}


def test_room_is_checked_before_the_first_byte() -> None:
    p = HostPlan({"a": (100 << 20, A)}, (), (), {}, {A: 100 << 20}, {"a": A})
    short = room_problem(p, 50 << 20, where="h1:/data")
    assert isinstance(short, NoRoom) and "h1:/data has 50 MiB free" in short.message
    assert room_problem(p, 200 << 20, where="h") is None
    assert room_problem(p, None, where="h") is None  # unknown: not refused


def test_small_contents_travel_first() -> None:
    p = plan_host({"big": (100, A), "small": (1, B), "mid": (50, C)}, NodeView({}, {}), where="h")
    assert list(p.incoming) == [B, C, A]
