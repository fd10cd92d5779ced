"""The run report in a real browser (Debian's headless Chromium): a 3-node run recorded by nodekit's own recorder
(a node killed, top's samples) renders without a console error and without fetching anything, shows every node
with every phase it reached and the failure marked, draws the charts, and its screenshot is a real picture.

Set NODEKIT_REPORT_SCREENSHOT=path to keep the screenshot (docs/guides/img/report.png was made so)."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from nodekit.launcher.contract import PREFLIGHT_OK, RENDEZVOUS_DONE
from nodekit.runs import report, store
from nodekit.runs.events import PHASES
from nodekit.runs.recorder import begin
from tests.conftest import unavailable
from tests.integration.browser import Browser, missing
from tests.integration.conftest import EXAMPLE

HOSTS = [(0, "root@172.31.250.10"), (1, "root@172.31.250.11"), (2, "root@172.31.250.12")]


def recorded_run(project: Path) -> Path:
    """examples/ddp's settings, three nodes, node 2 killed (SIGKILL) mid-training, top sampling every 2 s."""
    from nodekit.config import settings as config

    shutil.copy(EXAMPLE / "nodekit.toml", project / "nodekit.toml")
    settings = config.load(project / "nodekit.toml")
    now = [1_795_534_200.0]

    def at(dt: float) -> float:
        now[0] += dt
        return now[0]

    rec = begin(settings, "run", HOSTS, environ={}, clock=lambda: now[0])
    rec.image("nodekit/ddp-demo:1fa4ea1704e8", "sha256:" + "3" * 64, {})
    for r, dt in enumerate((0.4, 2.1, 2.3)):  # shipping: host 0 had it, 1 and 2 got it relayed
        at(dt)
        rec.phase(r, "image")
    for r in range(3):
        at(0.6)
        rec.phase(r, "started")
    for r in range(3):
        at(1.5 + r * 0.3)
        rec.line(r, f"nodekit ddp-demo: node {r}/3 | 1 proc/node | world 3")
    at(2.0)
    for r in range(3):
        rec.line(r, f"{PREFLIGHT_OK}, 3/3 nodes, identical stacks (image 1fa4ea1704e8, torch 2.13.0+cpu, cpu)")
    for r in range(3):
        at(0.4)
        rec.line(r, RENDEZVOUS_DONE)
    samples = []
    for epoch in range(8):
        for r in range(3):
            at(0.3)
            rec.line(r, f"ddp-demo: epoch {epoch} done" if r == 0 else f"rank {r} epoch {epoch}")
            cpu = 10.0 if (r == 2 and epoch > 5) else 160.0 + 10 * r
            samples.append({"t": now[0], "rank": r, "cpu_pct": cpu, "mem_bytes": (700 + 40 * epoch + r) * 2**20,
                            "rx_bps": 180_000.0 + r, "tx_bps": 175_000.0, "gpus": []})  # fmt: skip
    at(1.0)
    rec.exited(2, 137)
    for r in (0, 1):
        at(0.2)
        rec.line(r, "nodekit: node 2 (172.31.250.12) lost: no heartbeat for 15 s")
        rec.exited(r, 19)
    rec.failed(2, 137, "node 2 failed with exit code 137")
    rec.finish(137)
    store.append_samples(rec.dir, samples)
    page = report.render(store.load(rec.dir), store.read_samples(rec.dir), state="failed", now=now[0])
    return report.write(rec.dir / "report.html", page)


def distinct_bytes(png: bytes) -> int:
    """How many distinct byte values the image data holds (a blank page: very few)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IDAT":
            idat += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


SCRIPT = """
const q = (s) => Array.from(document.querySelectorAll(s));
return {
  title: document.title,
  nodes: q('#timeline g.node').map(g => g.dataset.rank),
  phases: q('#timeline line.phase').map(l => l.dataset.rank + ':' + l.dataset.phase),
  spans: q('#timeline rect.span').filter(r => r.getBBox().width > 0).length,
  failed: q('#timeline .failure-mark').map(g => g.dataset.rank),
  box: document.getElementById('failure') ? document.getElementById('failure').innerText : '',
  charts: q('svg.chart').map(s => s.dataset.metric + ':' + s.querySelectorAll('polyline').length),
  fetched: performance.getEntriesByType('resource').length,
  width: document.getElementById('timeline').getBoundingClientRect().width,
  height: document.documentElement.scrollHeight,
};
"""


def test_the_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    why = missing()
    if why is not None:
        unavailable("the report's browser test", why)
    page = recorded_run(tmp_path)
    browser = Browser(tmp_path / "profile", tmp_path / "chromedriver.log")
    try:
        browser.open(page.as_uri())
        seen = browser.run(SCRIPT)
        browser.resize(1200, min(int(seen["height"]) + 40, 4000))
        png = browser.screenshot()
        console = browser.console()
    finally:
        browser.close()
    assert seen["title"].startswith("nodekit run ")
    assert seen["nodes"] == ["0", "1", "2"]
    assert sorted(seen["phases"]) == sorted(f"{r}:{p}" for r in range(3) for p in PHASES)
    assert seen["spans"] == 15 and seen["failed"] == ["2"]
    assert "node 2 (root@172.31.250.12) failed: exit code 137 (SIGKILL)" in seen["box"]
    assert seen["charts"] == ["CPU:3", "memory:3", "network in:3", "network out:3"]
    assert seen["fetched"] == 0, "a self-contained page fetches nothing"
    assert seen["width"] >= 900
    assert [e for e in console if e.get("level") in ("SEVERE", "WARNING")] == [], console
    assert len(png) > 20_000 and distinct_bytes(png) > 100, "the screenshot is a picture, not a blank page"
    (tmp_path / "report.png").write_bytes(png)
    keep = os.environ.get("NODEKIT_REPORT_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(png)


@pytest.fixture(autouse=True)
def _no_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NODEKIT_CONFIG", "NODEKIT_NNODES", "NODEKIT_NAME"):
        monkeypatch.delenv(var, raising=False)
