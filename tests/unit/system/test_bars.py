"""A job's progress bar is one line per node, not a line per redraw (issue 32: 182 lines for 150 tqdm steps)."""

from __future__ import annotations

import io

from nodekit.system.bars import Bars, Shown


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tqdm_like(steps: int, seconds: float) -> list[tuple[float, str]]:
    """(time, line) as compose_logs yields a tqdm bar of ``steps`` redraws over ``seconds``, then its last line."""
    lines = [(i * seconds / steps, f"{100 * i // steps:3d}%|{'#' * (i * 10 // steps):<10}| {i}/{steps}\r") for i in
             range(steps)]  # fmt: skip
    return [*lines, (seconds, f"100%|##########| {steps}/{steps} [00:0{int(seconds)}]")]


def test_a_bar_is_at_most_one_line_a_second_and_ends_in_its_last_state() -> None:
    clock = Clock()
    bars = Bars(clock=clock)
    shown: list[Shown] = []
    start = clock.now
    for at, line in tqdm_like(steps=150, seconds=3.0):
        clock.now = start + at
        shown += bars.feed(0, line)
    shown += bars.flush()
    assert len(shown) <= 4, shown  # t = 0, 1, 2 and the last line
    assert shown[-1] == Shown(0, "100%|##########| 150/150 [00:03]")
    assert all(s.redraw for s in shown[:-1])


def test_two_nodes_each_get_their_line_and_other_lines_pass_untouched() -> None:
    clock = Clock()
    bars = Bars(clock=clock)
    out = bars.feed(0, " 10%|#\r") + bars.feed(1, " 12%|#\r") + bars.feed(0, " 11%|#\r")
    assert [(s.rank, s.text) for s in out] == [(0, " 10%|#"), (1, " 12%|#")]
    assert bars.feed(0, "epoch 1 loss 0.25") == [Shown(0, "epoch 1 loss 0.25")]
    # a bar that starts after a plain line shows at once, whenever the last one was
    assert bars.feed(0, "  0%|\r") == [Shown(0, "  0%|", redraw=True)]


def test_the_last_unshown_state_is_kept_when_the_bar_ends_with_an_empty_line_or_the_log_ends() -> None:
    clock = Clock()
    bars = Bars(clock=clock)
    bars.feed(0, " 1%\r")
    assert bars.feed(0, " 2%\r") == []
    assert bars.feed(0, "") == [Shown(0, " 2%")]
    bars.feed(1, " 1%\r")
    bars.feed(1, " 3%\r")
    assert bars.flush() == [Shown(1, " 3%")]
    assert bars.flush() == []


def test_the_printer_writes_plain_lines_to_a_file_and_redraws_in_place_on_a_terminal() -> None:
    from nodekit.cli.ui import JobLog

    clock = Clock()
    plain = io.StringIO()
    log = JobLog(stream=plain, bars=Bars(clock=clock))
    for line in (" 1%\r", " 2%\r", "done"):
        log(0, line)
    log.close()
    assert plain.getvalue() == "[node 0]  1%\n[node 0] done\n"

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    log = JobLog(stream=tty, bars=Bars(every=0, clock=clock))
    for rank, line in ((0, " 1%\r"), (0, " 2%\r"), (1, " 5%\r"), (1, "end")):
        log(rank, line)
    log.close()
    assert tty.getvalue() == "[node 0]  1%\r\x1b[K[node 0]  2%\n[node 1]  5%\r\x1b[K[node 1] end\n"
    only = io.StringIO()
    log = JobLog(only=1, stream=only)
    log(0, "zero")
    log(1, "one")
    assert only.getvalue() == "[node 1] one\n"
