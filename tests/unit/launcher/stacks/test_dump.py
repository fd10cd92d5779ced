"""faulthandler's text read back (nodekit/launcher/stacks/dump.py): real dumps of Python 3.11 and 3.13, and the
lines other versions add (3.14's thread names, a stack deeper than the limit, a thread with no Python frame)."""

from __future__ import annotations

import json

from nodekit.launcher.stacks.dump import Frame, complete, main_thread, parse
from tests.factories import STACK_FIXTURES as FIXTURES


def dump_of(name: str, index: int = 0) -> tuple[str, int]:
    process = json.loads((FIXTURES / name).read_text())["processes"][index]
    return process["dump"], process["main"]


def test_a_python_3_13_dump_parses_into_its_threads_innermost_frame_first() -> None:
    text, main = dump_of("py313-threads-node0.json")
    threads = parse(text)
    assert [t.current for t in threads] == [False, False, True]
    assert threads[0].frames[0] == Frame("/workspace/job.py", 13, "prefetch")
    assert threads[0].frames[-1].func == "_bootstrap"
    m = main_thread(threads, main)
    assert m is threads[2] and m.ident == main
    assert [f.func for f in m.outermost_first()] == ["<module>", "train_step", "all_reduce"]


def test_a_python_3_11_dump_of_a_rank_in_a_collective() -> None:
    process = json.loads((FIXTURES / "mismatch-node0.json").read_text())["processes"]
    rank0 = next(p for p in process if p["rank"] == 0)
    m = main_thread(parse(rank0["dump"]), rank0["main"])
    assert m is not None
    assert m.frames[0].file.endswith("torch/distributed/distributed_c10d.py") and m.frames[0].func == "all_reduce"
    assert m.frames[-1] == Frame("/workspace/stall.py", m.frames[-1].line, "<module>")


def test_what_other_versions_print_is_read_and_torn_lines_are_skipped() -> None:
    text = (
        "Thread 0x00007f0000000001 [prefetcher] (most recent call first):\n"
        "  <no Python frame>\n"
        "\n"
        "Current thread 0x00007f0000000002 [MainThread] (most recent call first):\n"
        '  File "/workspace/deep.py", line ??? in recurse\n'
        '  File "/workspace/deep.py", line 4 in recurse\n'
        "  ...\n"
        '  File "/workspace/de'
    )
    first, second = parse(text)
    assert first.name == "prefetcher" and first.frames == () and not first.current
    assert second.name == "MainThread" and second.current and second.cut
    assert second.frames == (Frame("/workspace/deep.py", None, "recurse"), Frame("/workspace/deep.py", 4, "recurse"))
    only = parse('Stack (most recent call first):\n  File "a.py", line 1 in <module>\n')
    assert len(only) == 1 and only[0].frames == (Frame("a.py", 1, "<module>"),)
    assert parse("") == [] and parse("garbage\n  File nothing\n") == []


def test_the_main_thread_is_the_recorded_one_else_the_one_running_module_code() -> None:
    text, _ = dump_of("py313-threads-node0.json")
    threads = parse(text)
    assert main_thread(threads, None) is threads[2]  # outermost frame <module>
    assert main_thread(threads, 12345) is threads[2]  # an id that is not there: the same rule
    assert main_thread(parse("Thread 0x1 (most recent call first):\n  <no Python frame>\n"), None) is None


def test_a_dump_being_written_is_complete_once_the_main_threads_stack_is_whole() -> None:
    text, main = dump_of("py313-threads-node0.json")
    assert complete(text, main)
    lines = text.splitlines(keepends=True)
    assert not complete("".join(lines[:-1]), main)  # the main thread's outermost frame not written yet
    assert not complete("".join(lines[:3]), main)  # the main thread not reached
    main_first = (
        f"Current thread {main:#018x} (most recent call first):\n"
        '  File "/workspace/job.py", line 16 in all_reduce\n'
        "\nThread 0x0000000000000001 (most recent call first):\n"
    )
    assert complete(main_first, main)  # another thread follows the main one
    assert complete(f"Current thread {main:#018x} (most recent call first):\n  ...\n", main)  # cut at the limit
