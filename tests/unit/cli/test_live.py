"""nodekit top's live table with a job's own last lines in it: rich renders each cell as text, never as markup,
and no terminal control sequence a job printed reaches the terminal (the review's six lines, through the sampler's
two log paths: the container's json-file and ``docker logs``)."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from nodekit.backends.fleet import sampler
from nodekit.cli.live import _plain, _rich

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
RAW = "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\ \x9b31mred\x9b0m \x1b[1mbold\x1b[0m tab\there\x00\x7f"
LINES = [
    ("epoch 3 [/2 done]", "epoch 3 [/2 done]"),  # a closing tag rich cannot match: MarkupError
    ("[rank0]: step 10", "[rank0]: step 10"),  # read as a style tag, and left out
    ("[link=https://evil.example/]click here[/link]", "[link=https://evil.example/]click here[/link]"),  # OSC 8
    ("[bold red]ALERT[/bold red] disk", "[bold red]ALERT[/bold red] disk"),
    (f"copy {OSC52}me", "copy me"),  # a clipboard write
    # raw OSC 8, 8-bit CSI, 7-bit CSI, C0 and DEL
    (RAW, "link red bold tab here"),
]


def view(rank: int, text: str, *, logjson: bool) -> sampler.NodeView:
    v = sampler.NodeView(rank=rank, where=f"root@h{rank}")
    record = json.dumps({"log": text + "\n", "stream": "stdout", "time": "2026-11-24T15:30:40Z"})
    log = f"logjson {record}" if logjson else f"log 2026-11-24T15:30:40Z {text}"
    for line in ("host h1 16000000", "state running 2026-11-24T15:30:12.5Z 0001-01-01T00:00:00Z 0", "t 1.0", log,
                 "end"):  # fmt: skip
        v.feed(line + "\n")
    return v


def rendered(table: object) -> str:
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system="truecolor", width=250).print(table)
    return buf.getvalue()


SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own styling of the table (its title, a quiet row)
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


@pytest.mark.parametrize("logjson", [True, False], ids=["json-file", "docker-logs"])
def test_a_jobs_last_line_is_shown_as_written_and_sends_the_terminal_nothing(logjson: bool) -> None:
    rows = [sampler.row(view(rank, text, logjson=logjson)) for rank, (text, _) in enumerate(LINES)]
    out = rendered(_rich(rows, "nodekit top: demo"))
    shown = SGR.sub("", out)
    assert not CONTROL.search(shown), repr(CONTROL.findall(shown))
    for _, literal in LINES:
        assert literal in shown, (literal, shown)
    assert [r.last_line for r in rows] == [literal for _, literal in LINES]
    assert "\x1b]8;" not in out and OSC52 not in out
    # --once's plain table shows the same lines.
    plain = _plain(rows)
    assert not CONTROL.search(plain) and all(literal in plain for _, literal in LINES)
