"""The receiver fed hostile plans and streams: each is refused whole, before anything is written, and nothing
outside the target changes (the whole test directory is compared before and after). A stream cut short leaves
staging that the next push reuses."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nodekit.launcher.datasync import frames, receive
from nodekit.launcher.datasync.node import load_state, staging_dir
from tests.unit.launcher.datasync.streams import plan_for, run, sha, snapshot, stream


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    """A target holding one file of the user's, beside a directory the receiver must never reach."""
    target, outside = tmp_path / "target", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    (target / "users-notes.txt").write_text("mine")
    (outside / "keep").write_text("keep")
    return target, outside


HOSTILE = {
    "dot-dot": {"../escaped": b"x"},
    "dot-dot inside": {"a/../../escaped": b"x"},
    "absolute": {"/tmp/nodekit-absolute-escape": b"x"},
    "empty component": {"a//b": b"x"},
    "nodekit's own state": {".nodekit-data/state.json": b"{}"},
    "not UTF-8": {os.fsdecode(b"bad-\xff"): b"x"},
    "NUL": {"a\x00b": b"x"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_name_refuses_the_whole_stream(case: str, world: tuple[Path, Path], capsys: Any) -> None:
    target, _ = world
    before = snapshot(target.parent)
    files = {"fine.bin": b"fine", **HOSTILE[case]}
    data = stream(plan_for(files), [(sha(d), d) for d in files.values()])
    assert run(target, data) == receive.REFUSED
    assert snapshot(target.parent) == before
    assert not Path("/tmp/nodekit-absolute-escape").exists()
    assert "refused" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["c", "b", "l", "p"])
def test_a_device_link_or_fifo_entry_is_refused(kind: str, world: tuple[Path, Path]) -> None:
    target, _ = world
    before = snapshot(target.parent)
    plan = plan_for({"fine.bin": b"fine"})
    plan["want"]["dev"] = [0, sha(b""), kind]
    assert run(target, stream(plan, [(sha(b"fine"), b"fine")])) == receive.REFUSED
    assert snapshot(target.parent) == before


def test_a_link_inside_the_target_is_never_written_through(world: tuple[Path, Path]) -> None:
    target, outside = world
    (target / "sub").symlink_to(outside)
    before = snapshot(target.parent)
    files = {"sub/planted": b"evil"}
    assert run(target, stream(plan_for(files), [(sha(b"evil"), b"evil")])) == receive.REFUSED
    assert snapshot(target.parent) == before and not (outside / "planted").exists()


def test_the_users_files_are_never_overwritten_or_deleted(world: tuple[Path, Path]) -> None:
    target, _ = world
    before = snapshot(target.parent)
    over = plan_for({"users-notes.txt": b"nodekit's"})
    assert run(target, stream(over, [(sha(b"nodekit's"), b"nodekit's")])) == receive.REFUSED
    delete = plan_for({}, delete=["users-notes.txt"])
    assert run(target, stream(delete)) == receive.REFUSED
    differs = plan_for({}, adopt=["users-notes.txt"])
    differs["want"]["users-notes.txt"] = [4, sha(b"nope"), "f"]
    assert run(target, stream(differs)) == receive.REFUSED
    assert snapshot(target.parent) == before


def test_content_that_does_not_match_its_hash_is_never_renamed_into_place(world: tuple[Path, Path]) -> None:
    target, _ = world
    plan = plan_for({"a.bin": b"good"})
    assert run(target, stream(plan, [(sha(b"good"), b"evil")])) == receive.BROKEN
    assert not (target / "a.bin").exists()
    assert (target / "users-notes.txt").read_text() == "mine"
    assert [n for n in os.listdir(staging_dir(str(target))) if not n.endswith(".part")] == []


def test_a_frame_the_plan_does_not_announce_stops_the_stream(world: tuple[Path, Path]) -> None:
    target, outside = world
    plan = plan_for({"a.bin": b"good"})
    assert run(target, stream(plan, [(sha(b"other"), b"other")])) == receive.BROKEN
    assert not (target / "a.bin").exists() and sorted(os.listdir(outside)) == ["keep"]


def test_a_stream_cut_short_keeps_what_arrived_whole_and_the_next_push_finishes(world: tuple[Path, Path]) -> None:
    target, _ = world
    (target / "users-notes.txt").unlink()  # else the target could never equal the source (the head refuses it)
    files = {"one.bin": b"1" * 5000, "two.bin": b"2" * 7000}
    plan = plan_for(files)
    cut = stream(plan, [(sha(files["one.bin"]), files["one.bin"])], end=False)
    cut += f"{sha(files['two.bin'])} 7000\n".encode() + b"2" * 100  # the head was killed here
    assert run(target, cut) == receive.BROKEN
    assert not (target / "one.bin").exists()  # nothing is renamed into place before the whole stream is in
    # Names nodekit was about to write are in its state before any rename: they are nodekit's, not the user's.
    assert set(load_state(str(target))) == {"one.bin", "two.bin"}
    from nodekit.launcher.datasync.node import scan

    seen = scan(str(target), {n: (len(d), sha(d)) for n, d in files.items()})
    assert seen["staged"] == {sha(files["one.bin"]): 5000}  # complete, hashed again to prove its name
    assert seen["foreign"] == {} and seen["owned"] == {}
    rest = plan_for(files)
    rest["incoming"] = {sha(files["two.bin"]): 7000}
    assert run(target, stream(rest, [(sha(files["two.bin"]), files["two.bin"])])) == 0
    assert {n: (target / n).read_bytes() for n in files} == files
    assert not os.path.exists(staging_dir(str(target)))


def test_a_target_that_ends_unequal_to_the_source_is_named(world: tuple[Path, Path]) -> None:
    target, _ = world
    (target / "users-notes.txt").unlink()
    plan = plan_for({"a.bin": b"a"})
    plan["want"]["never-sent.bin"] = [3, sha(b"abc"), "f"]  # a plan that does not place it: the check catches it
    said = io.StringIO()
    assert receive.main(["apply", str(target)], io.BytesIO(stream(plan, [(sha(b"a"), b"a")])), said) == receive.DIFFERS
    assert json.loads(said.getvalue())["diffs"] == ["never-sent.bin: missing"]


def test_a_link_on_the_node_is_never_read_as_a_copy_source_or_adopted(world: tuple[Path, Path]) -> None:
    target, outside = world
    (target / "users-notes.txt").unlink()
    (target / "looks-like-data").symlink_to(outside / "keep")
    before = snapshot(target.parent)
    content = b"keep"
    copy = plan_for({"a.bin": content}, copy={sha(content): "looks-like-data"}, incoming={})
    assert run(target, stream(copy)) == receive.REFUSED
    adopt = plan_for({}, adopt=["looks-like-data"])
    adopt["want"]["looks-like-data"] = [4, sha(content), "f"]
    assert run(target, stream(adopt)) == receive.REFUSED
    assert snapshot(target.parent) == before


def test_a_content_of_several_pieces_is_proven_by_the_manifests_hash(world: tuple[Path, Path]) -> None:
    from nodekit.launcher.datacheck.manifest import PIECE, content_hashes

    target, outside = world
    (target / "users-notes.txt").unlink()
    src = outside / "big"
    src.write_bytes(os.urandom(2 * PIECE + 5))
    data = src.read_bytes()
    h = content_hashes([(str(src), len(data))])[0]
    assert h.startswith("p:")
    plan = {"want": {"big": [len(data), h, "f"]}, "place": {"big": h}, "incoming": {h: len(data)}}
    assert run(target, stream(plan, [(h, data)])) == 0
    assert (target / "big").read_bytes() == data
    bad = bytearray(data)
    bad[PIECE + 7] ^= 1  # one flipped bit in the second piece
    os.unlink(target / "big")
    assert run(target, stream(plan, [(h, bytes(bad))])) == receive.BROKEN
    assert not (target / "big").exists()


def test_small_contents_are_hashed_as_they_arrive_and_big_ones_in_pieces_on_threads(
    world: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset of many small files is not handed to the hashing threads one file at a time (a thread hand-off per
    file costs more than hashing it); a content of several pieces still is, piece by piece."""
    import threading

    from nodekit.launcher.datacheck.manifest import PIECE

    target, _ = world
    (target / "users-notes.txt").unlink()
    hashed_on: list[tuple[int, str]] = []
    digest = frames.digest

    def recording(data: bytes) -> bytes:
        hashed_on.append((len(data), threading.current_thread().name))
        return digest(data)

    monkeypatch.setattr(frames, "digest", recording)
    files = {f"d{i % 3}/{i:03d}.jpg": os.urandom(100 + i) for i in range(200)}
    big = os.urandom(PIECE + 5000)
    plan = plan_for(files)
    h = "p:" + sha(hashlib.sha256(big[:PIECE]).digest() + hashlib.sha256(big[PIECE:]).digest())
    plan["want"]["big.arrow"], plan["place"]["big.arrow"], plan["incoming"][h] = [len(big), h, "f"], h, len(big)
    assert run(target, stream(plan, [*((sha(d), d) for d in files.values()), (h, big)])) == 0
    assert {n: (target / n).read_bytes() for n in files} == files and (target / "big.arrow").read_bytes() == big
    main = threading.current_thread().name
    assert {t for size, t in hashed_on if size < 1000} == {main}
    assert sorted(size for size, t in hashed_on if t != main) == [5000, PIECE]


def test_each_directory_of_the_node_is_looked_up_once_not_once_per_file(
    world: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a plan's parents and making its directories costs a syscall per directory, not per file in it."""
    target, _ = world
    (target / "users-notes.txt").unlink()
    files = {f"train/part{i % 4}/{i:04d}.jpg": b"x%d" % i for i in range(400)}
    looked: list[str] = []
    for fn in ("lstat", "stat"):
        real = getattr(os, fn)

        def counting(path: Any, *a: Any, real: Any = real, **kw: Any) -> Any:
            if os.path.isabs(str(path)) and str(path).startswith(str(target)):
                rel = os.path.relpath(str(path), target)
                if rel in ("train", *(f"train/part{i}" for i in range(4))):
                    looked.append(rel)
            return real(path, *a, **kw)

        monkeypatch.setattr(os, fn, counting)
    assert run(target, stream(plan_for(files), [(sha(d), d) for d in set(files.values())])) == 0
    monkeypatch.undo()
    assert {n: (target / n).read_bytes() for n in files} == files
    assert len(looked) <= 4 * 5, sorted(set(looked))


def test_a_renamed_file_moves_on_the_node_without_its_bytes_copied(world: tuple[Path, Path]) -> None:
    """The source renamed a (large) file: the node links the content it holds under the old name into staging
    instead of copying it, then the old name goes. A kept name's content is still copied: two names never share a
    file, which a write to one would change under the other."""
    target, _ = world
    (target / "users-notes.txt").unlink()
    data, kept = os.urandom(300_000), os.urandom(1000)
    assert (
        run(target, stream(plan_for({"old.bin": data, "keep.bin": kept}), [(sha(data), data), (sha(kept), kept)])) == 0
    )
    inode = (target / "old.bin").stat().st_ino
    plan = {
        "want": {"new/name.bin": [len(data), sha(data), "f"], "keep.bin": [1000, sha(kept), "f"],
                 "keep-copy.bin": [1000, sha(kept), "f"]},
        "place": {"new/name.bin": sha(data), "keep-copy.bin": sha(kept)},
        "copy": {sha(data): "old.bin", sha(kept): "keep.bin"},
        "incoming": {}, "delete": ["old.bin"], "adopt": [],
    }  # fmt: skip
    assert run(target, stream(plan)) == 0
    assert (target / "new" / "name.bin").read_bytes() == data and not (target / "old.bin").exists()
    assert (target / "new" / "name.bin").stat().st_ino == inode
    assert (target / "keep-copy.bin").read_bytes() == kept
    assert (target / "keep-copy.bin").stat().st_ino != (target / "keep.bin").stat().st_ino


@pytest.mark.parametrize("only", ["tokens.bin", "../tokens.bin", "sub/tokens.bin"])
def test_a_file_target_receives_its_one_name_and_nothing_beside_it(world: tuple[Path, Path], only: str) -> None:
    """A file target (a ``source`` that is one file) names one file in a directory that holds others: a plan naming
    anything but that file, or a target name that is not one plain name, is refused whole."""
    target, _ = world
    before = snapshot(target.parent)
    files = {"tokens.bin": b"tokens", "users-notes.txt": b"overwritten"}
    data = stream(plan_for(files), [(sha(d), d) for d in files.values()])
    assert receive.main(["apply", str(target), only], io.BytesIO(data), io.StringIO()) == receive.REFUSED
    assert snapshot(target.parent) == before
    if only == "tokens.bin":
        one = {"tokens.bin": b"tokens"}
        data = stream(plan_for(one), [(sha(b"tokens"), b"tokens")])
        assert receive.main(["apply", str(target), only], io.BytesIO(data), io.StringIO()) == 0
        assert (target / "tokens.bin").read_bytes() == b"tokens"
        assert (target / "users-notes.txt").read_text() == "mine"
        assert list(load_state(str(target))) == [] and list(load_state(str(target), only)) == [only]


def test_a_no_change_scan_answers_a_few_bytes_not_the_manifest_again(tmp_path: Path) -> None:
    """The head sends the source's manifest with the scan; what of the target equals it is not sent back (of
    100,000 files that is megabytes of JSON made, carried and read on every no-change push). A file that differs
    still comes back, with its own size and hash."""
    target = tmp_path / "target"
    files = {f"d/{i:04d}.bin": b"%d" % i for i in range(2000)}
    assert run(target, stream(plan_for(files), [(sha(d), d) for d in files.values()])) == 0
    want = {n: [len(d), sha(d)] for n, d in files.items()}
    payload = json.dumps(want).encode()

    def scan() -> dict[str, Any]:
        out = io.StringIO()
        assert receive.main(["scan", str(target)], io.BytesIO(b"%d\n" % len(payload) + payload), out) == 0
        assert len(out.getvalue()) < 500 or "d/0007.bin" in out.getvalue(), len(out.getvalue())
        answer = json.loads(out.getvalue())
        assert isinstance(answer, dict)
        return answer

    answer = scan()
    assert answer["owned"] == {} and answer["unequal"] == []
    (target / "d" / "0007.bin").write_bytes(b"changed")
    answer = scan()
    assert answer["owned"] == {"d/0007.bin": [7, sha(b"changed")]} and answer["unequal"] == ["d/0007.bin"]


def test_contents_a_shared_stream_carries_for_other_nodes_are_read_past_and_never_written(
    world: tuple[Path, Path],
) -> None:
    """A relay tree's stream carries every content any node of the tree lacks: a node reads past the ones it does
    not need (its plan's ``passing``), in any order, and writes only its own."""
    target, outside = world
    (target / "users-notes.txt").unlink()
    big = os.urandom(3 << 20)
    plan = plan_for({"a.bin": b"good"}, passing={sha(b"other"): 5, sha(big): len(big)})
    frames = [(sha(b"other"), b"other"), (sha(b"good"), b"good"), (sha(big), big)]
    assert run(target, stream(plan, frames)) == 0
    assert sorted(os.listdir(target)) == [".nodekit-data", "a.bin"]
    assert (target / "a.bin").read_bytes() == b"good" and sorted(os.listdir(outside)) == ["keep"]
    assert not os.path.exists(staging_dir(str(target)))


def test_a_passing_frame_of_another_size_than_announced_stops_the_stream(world: tuple[Path, Path]) -> None:
    target, _ = world
    plan = plan_for({"a.bin": b"good"}, passing={sha(b"other"): 5})
    assert run(target, stream(plan, [(sha(b"other"), b"other!"), (sha(b"good"), b"good")])) == receive.BROKEN
    assert not (target / "a.bin").exists()


def test_a_plan_whose_passing_contents_are_not_well_formed_is_refused(world: tuple[Path, Path]) -> None:
    target, _ = world
    for passing in ({"../x": 5}, {sha(b"other"): -1}, [sha(b"other")]):
        plan = plan_for({"a.bin": b"good"}, passing=passing)
        assert run(target, stream(plan, [(sha(b"good"), b"good")])) == receive.REFUSED, passing
        assert not (target / "a.bin").exists()
