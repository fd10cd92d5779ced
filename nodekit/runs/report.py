"""``nodekit runs report``: one self-contained HTML page of a run record (pure: record and samples in, text out).

Everything is inline (CSS and SVG; no script, font or image is fetched, so it opens offline and from a mail): a
header with what ran where, the failure when there was one (node, rank, exit code, signal, its last lines), a
timeline per node with its phases as coloured spans and each phase's moment marked, a table of the same times,
and charts of what ``nodekit top`` sampled during the run (CPU, memory, network, GPUs) when it ran. Elements carry
``data-rank`` and ``data-phase`` attributes, which the browser test reads.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nodekit.runs.events import PHASES
from nodekit.runs.model import RunRecord, ordered

COLORS = {"image": "#9aa5b1", "started": "#f0b429", "preflight": "#2186eb", "rendezvous": "#7b61ff",
          "output": "#3ebd93", "end": "#52606d"}  # fmt: skip
SPAN = {"image": "starting the container", "started": "launcher and preflight", "preflight": "rendezvous",
        "rendezvous": "until the first output", "output": "running"}  # fmt: skip
"""What a node is doing between reaching a phase and reaching the next."""
LINES = ("#2186eb", "#e12d39", "#3ebd93", "#f0b429", "#7b61ff", "#52606d", "#d9822b", "#0f609b")
W, LABEL_W, ROW_H = 1000, 190, 30

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2933;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.meta{color:#52606d}.meta code{background:#f0f4f8;padding:1px 4px;border-radius:3px}
.ok{color:#0c6b58}.bad{color:#ba2525}
.failure{border:1px solid #e12d39;background:#ffeeee;padding:10px 14px;border-radius:6px;margin:14px 0}
pre{background:#1f2933;color:#f5f7fa;padding:10px;border-radius:4px;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #d9e2ec;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border-radius:2px}
svg text{font:12px system-ui,sans-serif;fill:#323f4b}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{int(s // 60)} min {s % 60:.0f} s"


def timeline(record: RunRecord, now: float) -> str:
    """The SVG timeline: a row per node, each phase a span until the next, the failure marked."""
    t0 = record.started
    end = max([record.ended or now, *(t for n in record.nodes for t in n.phases.values())])
    scale = (W - LABEL_W - 20) / max(end - t0, 1e-3)

    def x(t: float) -> float:
        return LABEL_W + (t - t0) * scale

    h = ROW_H * len(record.nodes) + 40
    out = [f'<svg id="timeline" width="{W}" height="{h}" viewBox="0 0 {W} {h}" role="img" aria-label="timeline">']
    for i in range(6):  # the time axis
        t = t0 + (end - t0) * i / 5
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="0" y2="{h - 24}" stroke="#e4e7eb"/>'
                   f'<text x="{x(t):.1f}" y="{h - 8}" text-anchor="middle">{_e(_secs(t - t0))}</text>')  # fmt: skip
    for row, node in enumerate(record.nodes):
        y = row * ROW_H + 6
        out.append(f'<g class="node" data-rank="{_e(node.rank)}"><text x="0" y="{y + 15}">node {_e(node.rank)} '
                   f'<tspan fill="#7b8794">{_e(node.host[:22])}</tspan></text>')  # fmt: skip
        reached = ordered(node.phases)
        for k, (phase, t) in enumerate(reached):
            stop = reached[k + 1][1] if k + 1 < len(reached) else (t if phase == "end" else (record.ended or now))
            tip = f"node {node.rank}: {SPAN.get(phase, '')}, {_secs(stop - t)}"
            if phase != "end":
                width = max(1.0, x(stop) - x(t))
                out.append(f'<rect class="span" data-phase="{_e(phase)}" x="{x(t):.1f}" y="{y}" width="{width:.1f}" '
                           f'height="{ROW_H - 10}" fill="{COLORS[phase]}" opacity="0.85">'
                           f"<title>{_e(tip)}</title></rect>")  # fmt: skip
            tip = f"node {node.rank}: {phase} at +{_secs(t - t0)}"
            out.append(f'<line class="phase" data-phase="{_e(phase)}" data-rank="{_e(node.rank)}" x1="{x(t):.1f}" '
                       f'x2="{x(t):.1f}" y1="{y - 2}" y2="{y + ROW_H - 8}" stroke="#1f2933" stroke-width="1.5">'
                       f"<title>{_e(tip)}</title></line>")  # fmt: skip
        if record.failed_rank == node.rank:
            t = node.phases.get("end", record.ended or now)
            what = f"exit {node.exit_code}" if node.exit_code is not None else "lost"
            sig = f", {record.signal}" if record.signal else ""
            out.append(f'<g class="failure-mark" data-rank="{_e(node.rank)}">'
                       f'<circle cx="{x(t):.1f}" cy="{y + 10}" r="8" fill="#e12d39"/>'
                       f'<text x="{x(t) - 4:.1f}" y="{y + 14}" fill="#fff" style="fill:#fff">×</text>'
                       f"<title>node {_e(node.rank)} failed: {_e(what + sig)}</title></g>")  # fmt: skip
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{_e(t)}</span>' for t, c in items) + "</p>"
    )


def phase_table(record: RunRecord) -> str:
    head = "".join(f"<th>{p}</th>" for p in PHASES)
    rows = []
    for n in record.nodes:
        cells = "".join(
            f'<td data-phase="{p}">{"+" + _secs(n.phases[p] - record.started) if p in n.phases else "–"}</td>'
            for p in PHASES
        )
        code = "lost" if n.lost else ("" if n.exit_code is None else str(n.exit_code))
        rows.append(
            f'<tr data-rank="{_e(n.rank)}"><td>node {_e(n.rank)} ({_e(n.host)})</td>{cells}<td>{_e(code)}</td></tr>'
        )
    return f'<table id="phases"><tr><th>node</th>{head}<th>exit</th></tr>{"".join(rows)}</table>'


def chart(title: str, series: Mapping[int, list[tuple[float, float]]], t0: float, unit: str,
          fmt: Callable[[float], str] = lambda v: f"{v:.0f}") -> str:  # fmt: skip
    """One line chart: a polyline per node (rank -> [(time, value)])."""
    points = [p for s in series.values() for p in s]
    if not points:
        return ""
    tmin, tmax = min(t for t, _ in points), max(t for t, _ in points)
    vmax = max(max(v for _, v in points), 1e-9) * 1.1
    w, h, left = 480, 180, 56

    def xy(t: float, v: float) -> str:
        return f"{left + (t - tmin) / max(tmax - tmin, 1e-3) * (w - left - 10):.1f},{h - 24 - v / vmax * (h - 40):.1f}"

    out = [f'<svg class="chart" data-metric="{_e(title)}" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
           f'<text x="{left}" y="12">{_e(title)} ({_e(unit)})</text>'
           f'<text x="{left - 6}" y="{h - 24}" text-anchor="end">0</text>'
           f'<text x="{left - 6}" y="22" text-anchor="end">{_e(fmt(vmax))}</text>'
           f'<text x="{left}" y="{h - 6}">+{_e(_secs(tmin - t0))}</text>'
           f'<text x="{w - 10}" y="{h - 6}" text-anchor="end">+{_e(_secs(tmax - t0))}</text>'
           f'<line x1="{left}" x2="{w - 10}" y1="{h - 24}" y2="{h - 24}" stroke="#9aa5b1"/>']  # fmt: skip
    for k, (rank, s) in enumerate(sorted(series.items())):
        pts = " ".join(xy(t, v) for t, v in s)
        out.append(f'<polyline data-rank="{_e(rank)}" points="{pts}" fill="none" stroke="{LINES[k % len(LINES)]}" '
                   f'stroke-width="1.8"><title>node {_e(rank)}</title></polyline>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def charts(record: RunRecord, samples: Sequence[Mapping[str, Any]]) -> str:
    """The charts of ``nodekit top``'s samples (those with a time and a rank)."""

    def scaled(key: str, by: float) -> Callable[[Mapping[str, Any]], float | None]:
        return lambda s: s[key] / by if isinstance(s.get(key), int | float) else None

    def whole(v: float) -> str:
        return f"{v:.0f}"

    metrics: dict[str, tuple[str, Callable[[Mapping[str, Any]], float | None], Callable[[float], str]]] = {
        "CPU": ("% of one core", scaled("cpu_pct", 1), whole),
        "memory": ("MiB", scaled("mem_bytes", 2**20), whole),
        "network in": ("KiB/s", scaled("rx_bps", 1024), whole),
        "network out": ("KiB/s", scaled("tx_bps", 1024), whole),
        "GPU": ("% busy, mean of the node's GPUs", _gpu_util, whole),
    }
    out = []
    for title, (unit, value, fmt) in metrics.items():
        series: dict[int, list[tuple[float, float]]] = {}
        for s in samples:
            v = value(s)
            if v is not None and isinstance(s.get("t"), int | float) and isinstance(s.get("rank"), int):
                series.setdefault(s["rank"], []).append((float(s["t"]), float(v)))
        out.append(chart(title, series, record.started, unit, fmt))
    drawn = [c for c in out if c]
    if not drawn:
        return '<p class="meta">nodekit top did not run during this run: nothing was sampled.</p>'
    legend = _legend([(f"node {n.rank}", LINES[k % len(LINES)]) for k, n in enumerate(record.nodes)])
    return legend + "".join(drawn)


def _gpu_util(s: Mapping[str, Any]) -> float | None:
    gpus = s.get("gpus") or []
    utils = [g["util"] for g in gpus if isinstance(g, dict) and isinstance(g.get("util"), int | float)]
    return sum(utils) / len(utils) if utils else None


def render(record: RunRecord, samples: Sequence[Mapping[str, Any]], *, state: str, now: float) -> str:
    """The whole page. ``state`` is the record's state as the caller judged it (running, ok, failed, ...)."""
    took = _secs(record.duration(now))
    status = f'<b class="{"ok" if state == "ok" else "bad"}">{_e(state)}</b>'
    code = "" if record.exit_code is None else f", exit code {record.exit_code}"
    meta = [
        f"<code>nodekit {_e(record.command)}</code> in <code>{_e(record.project)}</code>, {status}{_e(code)}, "
        f"{_e(took)} from {_e(_when(record.started))}",
        f"image <code>{_e(record.image or '?')}</code> id <code>{_e(record.image_id[:19] or '?')}</code> "
        f"fingerprint <code>{_e(record.fingerprint[:12] or '?')}</code>",
        f"settings <code>{_e(record.settings_digest[:12])}</code> "
        f"lock <code>{_e(record.lock_digest[:12] or '?')}</code>"
        + (f", {_e(record.attempts)} attempts" if record.attempts > 1 else "")
        + (f", Slurm job {_e(record.job_id)}" if record.job_id else ""),
    ]
    failure = ""
    if record.exit_code not in (None, 0):
        who = (f"node {_e(record.failed_rank)} ({_e(record.failed_host)})" if record.failed_rank is not None
               else "the run")  # fmt: skip
        sig = f" ({_e(record.signal)})" if record.signal else ""
        tail = "\n".join(record.log_tail)
        rank = "" if record.failed_rank is None else record.failed_rank
        failure = (f'<div class="failure" id="failure" data-rank="{_e(rank)}">'
                   f"<b>{who} failed</b>: exit code {_e(record.exit_code)}{sig}"
                   + (f"<br>{_e(record.reason)}" if record.reason else "")
                   + (f"<pre>{_e(tail)}</pre>" if tail else "") + "</div>")  # fmt: skip
    legend = _legend([(f"{p}: {SPAN.get(p, 'ended')}", COLORS[p]) for p in PHASES])
    title = f"nodekit run {record.id}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<style>{CSS}</style></head><body><h1>{_e(title)}</h1>"
        + "".join(f'<div class="meta">{m}</div>' for m in meta)
        + failure
        + f"<h2>Timeline</h2>{legend}{timeline(record, now)}"
        + f"<h2>Phases (seconds after the start)</h2>{phase_table(record)}"
        + f"<h2>What nodekit top sampled</h2>{charts(record, samples)}</body></html>\n"
    )


def write(path: Path, text: str, *, within: Path | None = None) -> Path:
    """``path`` holding ``text``, 0600; never through a link at or below ``within`` (a cloned repository can ship
    .nodekit/runs/<id>/report.html pointing anywhere)."""
    from nodekit.system.files import write_atomic

    write_atomic(path, text, mode=0o600, within=within)
    return path
