"""The ``[notify]`` webhook: a message when a run starts, fails (node, rank, exit code, the last lines of its log) and
finishes (with its duration), as Slack-compatible JSON (``{"text": ...}``) or plain JSON with every field.

The URL is a secret (whoever holds a Slack webhook URL can post to the channel): it is read from the variable or
file ``[notify]`` names, on the machine that runs nodekit, when a run starts; it stays in this process's memory
(never printed: every message about it says "the webhook"; never in a record, a compose file or a process's
arguments: the standard library's HTTP client sends it, no curl). Sending never holds up or fails the job: each
message goes in a thread of its own, with bounded retries (errors, timeouts, 429 and 5xx; backing off), all within
``deadline_s``; the command waits for the last ones at most that long once the job has ended.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nodekit.config.tables import NotifySettings
from nodekit.runs.model import RunRecord, signal_of

Event = Literal["start", "failure", "finish"]
TAIL_LINES = 20
MASK = "<the webhook>"
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Webhook:
    """Where messages go (``url`` is the secret: never shown; :meth:`__repr__` leaves it out) and how."""

    url: str = field(repr=False)
    settings: NotifySettings


def webhook(cfg: NotifySettings, environ: Mapping[str, str], project_dir: Path) -> tuple[Webhook | None, str]:
    """The configured webhook, or None and why not ("" when none is configured). Never raises: a notification
    problem is a warning, never a reason not to run the job."""
    if not cfg.configured:
        return None, ""
    url = ""
    if cfg.url_env is not None:
        url = environ.get(cfg.url_env, "").strip()
        if not url and cfg.url_file is None:
            return None, f"notify: ${cfg.url_env} is not set here, so no message is sent (export it first)"
    if not url and cfg.url_file is not None:
        path = Path(os.path.expanduser(cfg.url_file))
        path = path if path.is_absolute() else project_dir / path
        try:
            url = path.read_text().strip().splitlines()[0].strip() if path.stat().st_size else ""
        except (OSError, IndexError, UnicodeDecodeError) as e:
            return (
                None,
                f"notify: cannot read the webhook file {path} ({getattr(e, 'strerror', None) or e}): no message",
            )
        if path.stat().st_mode & 0o077:
            return None, f"notify: {path} is readable by other users; chmod 600 {path} (no message is sent until then)"
    if not url.startswith(("https://", "http://")) or any(c.isspace() for c in url):
        return None, "notify: the webhook URL is not an http(s):// URL, so no message is sent"
    return Webhook(url=url, settings=cfg), ""


# --- what is said (pure) ----------------------------------------------------------------------------------------


def _took(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def slack_escaped(value: object) -> str:
    """A record's value as Slack text: ``&``, ``<`` and ``>`` escaped (Slack's rule; ``<!channel>`` would notify
    everyone and ``<https://x|y>`` shows y for a link to x), and no run of three backticks, which would end nodekit's
    code block (a zero-width space after each backtick that another follows)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub("`(?=`)", "`\u200b", text)


def text(event: Event, record: RunRecord, now: float, *, quote: Callable[[object], str] = str) -> str:
    """The message in words (one line, plus the failing node's last lines for a failure). ``quote`` writes each
    value the record holds (the job's lines, hosts, names: whatever a run or a cloned repo put there) for the
    reader: :func:`slack_escaped` for Slack."""
    what = f"nodekit {quote(record.command)} {quote(record.id)} ({quote(Path(record.project).name)})"
    hosts = ", ".join(quote(n.host) for n in record.nodes[:8]) + (" ..." if len(record.nodes) > 8 else "")
    if event == "start":
        return f"{what} started on {len(record.nodes)} node(s): {hosts}; image {quote(record.image or '?')}"
    took = _took(record.duration(now))
    if event == "finish":
        return f"{what} finished in {took} on {len(record.nodes)} node(s) (exit code 0)"
    if record.refused:  # nothing started anywhere: a refusal to fix, not a failure to look into
        return f"{what} was refused before any node started (exit code {record.exit_code}): {quote(record.reason)}"
    who = f"node {record.failed_rank} ({quote(record.failed_host)})" if record.failed_rank is not None else "the run"
    sig = f", {quote(record.signal)}" if record.signal else ""
    head = f"{what} FAILED after {took}: {who}, exit code {record.exit_code}{sig}"
    reason = f"\n{quote(record.reason)}" if record.reason else ""
    tail = "\n".join(quote(line) for line in record.log_tail[-TAIL_LINES:])
    return f"{head}{reason}" + (f"\n```\n{tail}\n```" if tail else "")


def payload(event: Event, record: RunRecord, fmt: Literal["slack", "json"], now: float) -> dict[str, Any]:
    """The JSON body: ``{"text": ...}`` for Slack and its kin, else every field a script might want."""
    if fmt == "slack":
        return {"text": text(event, record, now, quote=slack_escaped)}
    said = text(event, record, now)
    failed = record.node(record.failed_rank) if record.failed_rank is not None else None
    return {
        "event": event,
        "run": record.id,
        "command": record.command,
        "project": record.project,
        "nodes": [{"rank": n.rank, "host": n.host} for n in record.nodes],
        "image": record.image,
        "image_id": record.image_id,
        "exit_code": record.exit_code if event != "start" else None,
        "rank": record.failed_rank,
        "node": failed.host if failed else None,
        "signal": record.signal or signal_of(record.exit_code) or None,
        "duration_s": round(record.duration(now), 1) if event != "start" else None,
        "log_tail": record.log_tail[-TAIL_LINES:] if event == "failure" else [],
        "text": said,
    }


# --- sending ----------------------------------------------------------------------------------------------------

Post = Callable[[str, bytes, float], int]
"""``post(url, body, timeout)``: the HTTP status; raises OSError (urllib's errors are OSErrors) on failure."""


def http_post(url: str, body: bytes, timeout: float) -> int:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "nodekit"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # http(s) only: checked by webhook()
            resp.read(65536)
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _retry(status: int) -> bool:
    return status == 429 or status >= 500


class Notifier:
    """Sends messages in the background, one after the other in the order sent; :meth:`close` waits for them within
    their deadline and returns what went wrong, in words without the URL. ``post``, ``clock`` and ``sleep`` are for
    tests."""

    def __init__(
        self,
        hook: Webhook,
        *,
        post: Post = http_post,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.hook, self._post, self._clock, self._sleep = hook, post, clock, sleep
        self._threads: list[tuple[threading.Thread, float]] = []
        self._problems: list[str] = []
        self._lock = threading.Lock()
        self.delivered: list[Event] = []

    def send(self, event: Event, body: Mapping[str, Any]) -> None:
        """Start sending ``body`` (returns at once); nothing when ``[notify] on`` leaves ``event`` out."""
        if event not in self.hook.settings.on:
            return
        deadline = self._clock() + self.hook.settings.deadline_s
        data = json.dumps(body).encode()
        # In order: each message waits (within its own deadline) until the one before it is through or given up,
        # so a webhook never shows a failure before the start it follows.
        before = self._threads[-1][0] if self._threads else None
        t = threading.Thread(target=self._deliver, args=(event, data, deadline, before), daemon=True,
                             name=f"notify-{event}")  # fmt: skip
        t.start()
        self._threads.append((t, deadline))

    def _deliver(self, event: Event, data: bytes, deadline: float, before: threading.Thread | None = None) -> None:
        if before is not None:
            before.join(max(0.0, deadline - self._clock()))
        cfg = self.hook.settings
        why = ""
        for attempt in range(cfg.retries + 1):
            left = deadline - self._clock()
            if left <= 0:
                why = why or "its deadline passed"
                break
            try:
                status = self._post(self.hook.url, data, min(cfg.timeout_s, left))
            except (OSError, ValueError) as e:  # refused, reset, timed out, a bad URL
                why = _masked(str(getattr(e, "reason", None) or e) or type(e).__name__, self.hook.url)
            else:
                if 200 <= status < 300:
                    with self._lock:
                        self.delivered.append(event)
                    return
                why = f"HTTP {status}"
                if not _retry(status):
                    break
            if attempt < cfg.retries:
                self._sleep(min(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)], max(0.0, deadline - self._clock())))
        with self._lock:
            self._problems.append(f"the {event} message did not reach the webhook: {why}")

    def close(self) -> list[str]:
        """Wait for every message until it is through or its deadline has passed; the problems, in words."""
        for t, deadline in self._threads:
            t.join(max(0.0, deadline - self._clock()))
        with self._lock:
            late = [t.name.removeprefix("notify-") for t, _ in self._threads if t.is_alive()]
            return [*self._problems, *(f"the {e} message did not reach the webhook in time" for e in late)]


def _masked(said: str, url: str) -> str:
    return said.replace(url, MASK) if url else said


def problems_text(problems: Sequence[str]) -> str:
    return "; ".join(problems)
