"""The report page (pure): every node and phase present and marked for the browser test, the failure marked,
charts of top's samples, nothing fetched from anywhere, hostile text escaped."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from nodekit.runs import report, store
from nodekit.runs.events import PHASES
from nodekit.runs.recorder import begin
from tests.factories import HOSTS, play_three_nodes, project_settings
from tests.factories import RunClock as Clock


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def tags(page: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Tags()
    p.feed(page)
    return p.found


def failed_run(tmp_path: Path) -> tuple[Path, Clock]:
    clock = Clock()
    rec = begin(project_settings(tmp_path), "run", HOSTS, environ={}, clock=clock)
    play_three_nodes(rec, clock, kill=2)
    rec.line(2, "<script>alert('boom')</script>")
    rec.failed(2, 137, "node 2 failed with exit code 137")
    rec.finish(137)
    samples = [{"t": rec.record.started + 3 + i, "rank": r, "cpu_pct": 90.0 + r, "mem_bytes": 2**28, "rx_bps": 1e4,
                "tx_bps": 2e4, "gpus": [{"index": 0, "util": 50.0}]} for i in range(5) for r in range(3)]  # fmt: skip
    store.append_samples(rec.dir, samples)
    return rec.dir, clock


def test_every_node_and_phase_is_drawn_and_the_failure_is_marked(tmp_path: Path, clean_env: None) -> None:
    d, clock = failed_run(tmp_path)
    page = report.render(store.load(d), store.read_samples(d), state="failed", now=clock.now)
    found = tags(page)
    nodes = {a["data-rank"] for t, a in found if t == "g" and a.get("class") == "node"}
    assert nodes == {"0", "1", "2"}
    marks = {(a["data-rank"], a["data-phase"]) for t, a in found if t == "line" and a.get("class") == "phase"}
    assert marks == {(str(r), p) for r in range(3) for p in PHASES}
    spans = [a["data-phase"] for t, a in found if t == "rect" and a.get("class") == "span"]
    assert sorted(set(spans)) == sorted(p for p in PHASES if p != "end") and len(spans) == 15
    assert [a["data-rank"] for t, a in found if a.get("class") == "failure-mark"] == ["2"]
    assert [a["data-rank"] for t, a in found if a.get("id") == "failure"] == ["2"]
    assert "SIGKILL" in page and "root@10.0.0.3" in page
    charts = [a["data-metric"] for t, a in found if t == "svg" and a.get("class") == "chart"]
    assert charts == ["CPU", "memory", "network in", "network out", "GPU"]
    assert len([1 for t, a in found if t == "polyline"]) == 15


def test_the_page_is_self_contained_and_escapes_what_the_job_printed(tmp_path: Path, clean_env: None) -> None:
    d, clock = failed_run(tmp_path)
    page = report.render(store.load(d), [], state="failed", now=clock.now)
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;boom&#x27;)&lt;/script&gt;" in page
    assert not re.search(r"""(src|href)\s*=""", page), "nothing is fetched: no src or href at all"
    assert "url(" not in page and "@import" not in page
    assert "default-src 'none'" in page
    assert "nodekit top did not run during this run" in page


def test_a_run_still_going_is_drawn_to_now(tmp_path: Path, clean_env: None) -> None:
    clock = Clock()
    rec = begin(project_settings(tmp_path), "run", HOSTS, environ={}, clock=clock)
    rec.phase(0, "image")
    clock.tick(30)
    page = report.render(rec.record, [], state="running", now=clock.now)
    assert "30.0 s" in page and 'id="failure"' not in page
