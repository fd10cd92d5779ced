"""The [notify] webhook against a real HTTP server on this machine: messages arrive (Slack's and plain JSON),
a server that answers 500 is retried a bounded number of times, one that hangs never holds up the caller longer
than the deadline, and the URL (a secret) never appears in anything nodekit says or writes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from nodekit.config.tables import NotifySettings
from nodekit.runs import store
from nodekit.runs.notify import Notifier, payload, webhook
from nodekit.runs.recorder import begin, recording
from tests.factories import HOSTS, play_three_nodes, project_settings
from tests.factories import RunClock as Clock

FAST = NotifySettings(url_env="HOOK", timeout_s=0.5, retries=2, deadline_s=3)


def notifier(url: str, cfg: NotifySettings = FAST) -> Notifier:
    hook, why = webhook(cfg, {"HOOK": url}, Path("/"))
    assert hook is not None, why
    return Notifier(hook)


def test_a_run_says_start_then_failure_with_node_rank_code_and_its_last_lines(
    tmp_path: Path, clean_env: None, webhook: Any
) -> None:
    server = webhook("ok")
    settings = project_settings(tmp_path, '[notify]\nurl_env = "HOOK"\nformat = "json"\n')
    clock = Clock()
    warned: list[str] = []
    with recording(settings, "run", HOSTS, warn=warned.append, environ={"HOOK": server.url}, clock=clock) as rec:
        play_three_nodes(rec, clock, kill=2)
        rec.failed(2, 137, "node 2 failed with exit code 137")
        rec.finish(137)
    assert warned == []
    start, failure = server.received
    assert start["event"] == "start" and [n["host"] for n in start["nodes"]] == [h for _, h in HOSTS]
    assert start["image"] == "nodekit/recdemo:0123456789ab" and start["exit_code"] is None
    assert (failure["event"], failure["rank"], failure["node"], failure["exit_code"]) == (
        "failure",
        2,
        HOSTS[2][1],
        137,
    )
    assert failure["signal"] == "SIGKILL" and failure["duration_s"] == pytest.approx(
        clock.now - rec.record.started, 0.1
    )
    assert failure["log_tail"][-1] == "step 29 on rank 2" and "FAILED" in failure["text"]
    # The URL is nowhere nodekit writes: the record, the merged log.
    for f in rec.dir.iterdir():
        assert "s3cr3t-token" not in f.read_text(), f


def test_slack_gets_text_and_a_finish_with_the_duration(tmp_path: Path, clean_env: None, webhook: Any) -> None:
    server = webhook("ok")
    settings = project_settings(tmp_path, '[notify]\nurl_env = "HOOK"\n')
    clock = Clock()
    with recording(settings, "run", HOSTS, warn=print, environ={"HOOK": server.url}, clock=clock) as rec:
        rec.image("nodekit/recdemo:0123456789ab", "sha256:1", {})
        clock.tick(65)
        rec.finish(0)
    assert [list(m) for m in server.received] == [["text"], ["text"]]
    assert "started on 3 node(s): root@10.0.0.1, root@10.0.0.2, root@10.0.0.3" in server.received[0]["text"]
    assert "finished in 1m 05s on 3 node(s)" in server.received[1]["text"]


def test_a_server_that_answers_500_is_retried_then_given_up_on(webhook: Any) -> None:
    server = webhook("500")
    n = notifier(server.url)
    t0 = time.monotonic()
    n.send("failure", {"text": "x"})
    problems = n.close()
    assert server.requests == FAST.retries + 1
    assert time.monotonic() - t0 < FAST.deadline_s + 1
    assert problems == ["the failure message did not reach the webhook: HTTP 500"]


def test_a_hanging_server_never_holds_up_the_caller_beyond_the_deadline(webhook: Any) -> None:
    server = webhook("hang")
    n = notifier(server.url, NotifySettings(url_env="HOOK", timeout_s=0.4, retries=1, deadline_s=1.5))
    t0 = time.monotonic()
    n.send("start", {"text": "x"})
    sent = time.monotonic() - t0
    problems = n.close()
    waited = time.monotonic() - t0
    assert sent < 0.2, "send must return at once"
    assert waited < 1.5 + 0.5, waited
    assert server.requests == 2, "the timeout of each attempt and one retry, within the deadline"
    assert problems and all("s3cr3t" not in p and "127.0.0.1" not in p for p in problems), problems


def test_a_hanging_start_does_not_hold_back_the_finish(tmp_path: Path, clean_env: None, webhook: Any) -> None:
    server = webhook("hang-first")
    settings = project_settings(tmp_path, '[notify]\nurl_env = "HOOK"\ntimeout_s = 0.5\nretries = 0\ndeadline_s = 2\n')
    warned: list[str] = []
    t0 = time.monotonic()
    with recording(settings, "run", HOSTS, warn=warned.append, environ={"HOOK": server.url}) as rec:
        rec.image("nodekit/recdemo:0123456789ab", "sha256:1", {})
        rec.finish(0)
    assert time.monotonic() - t0 < 2.5
    assert [m["text"].split(" ", 5)[4] for m in server.received] == ["started", "finished"]
    assert warned == ["notify: the start message did not reach the webhook: timed out"], warned


def test_events_left_out_of_on_send_nothing(webhook: Any) -> None:
    server = webhook("ok")
    n = notifier(server.url, NotifySettings(url_env="HOOK", on=("failure",)))
    n.send("start", {"text": "s"})
    n.send("failure", {"text": "f"})
    assert n.close() == [] and server.received == [{"text": "f"}]


def test_where_the_url_comes_from_and_what_is_said_when_it_cannot(tmp_path: Path) -> None:
    url = "https://hooks.example.com/services/T0/B0/s3cr3t"
    assert webhook(NotifySettings(), {}, tmp_path) == (None, "")
    hook, why = webhook(NotifySettings(url_env="HOOK"), {"HOOK": url}, tmp_path)
    assert hook is not None and hook.url == url and why == "" and "s3cr3t" not in repr(hook)
    hook, why = webhook(NotifySettings(url_env="HOOK"), {}, tmp_path)
    assert hook is None and "$HOOK is not set" in why
    secret = tmp_path / "webhook"
    secret.write_text(url + "\n")
    secret.chmod(0o644)
    hook, why = webhook(NotifySettings(url_file=Path("webhook")), {}, tmp_path)
    assert hook is None and "readable by other users" in why and "chmod 600" in why
    secret.chmod(0o600)
    hook, why = webhook(NotifySettings(url_file=Path("webhook")), {}, tmp_path)
    assert hook is not None and hook.url == url
    for bad in ("file:///etc/passwd", "ftp://x", "https://x y"):
        hook, why = webhook(NotifySettings(url_env="HOOK"), {"HOOK": bad}, tmp_path)
        assert hook is None and "not an http(s):// URL" in why and bad not in why


def test_the_url_is_in_no_process_argument(tmp_path: Path, clean_env: None, webhook: Any) -> None:
    """The standard library sends it: no curl, no child process; this process's own argv is the test runner's."""
    server = webhook("ok")
    settings = project_settings(tmp_path, '[notify]\nurl_env = "HOOK"\n')
    before = set(os.listdir("/proc"))
    rec = begin(settings, "run", HOSTS, environ={"HOOK": server.url}, warn=print)
    rec.image("nodekit/recdemo:0123456789ab", "sha256:1", {})
    rec.finish(0)
    assert rec.notifier is not None and rec.notifier.close() == []
    for pid in set(os.listdir("/proc")) - before:
        try:
            assert "s3cr3t" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        except OSError:
            continue
    assert "s3cr3t" not in Path(f"/proc/{os.getpid()}/cmdline").read_text(errors="replace")
    assert len(server.received) == 2


def test_payloads_are_json_with_every_field_or_slack_text(tmp_path: Path, clean_env: None) -> None:
    clock = Clock()
    rec = begin(project_settings(tmp_path), "run", HOSTS, environ={}, clock=clock)
    clock.tick(5)
    rec.finish(0)
    r = store.load(rec.dir)
    assert set(payload("finish", r, "slack", clock.now + 100)) == {"text"}
    full = payload("finish", r, "json", clock.now + 100)
    assert full["duration_s"] == 5.0 and full["exit_code"] == 0 and full["run"] == r.id and full["log_tail"] == []


def test_messages_reach_the_webhook_in_the_order_they_were_sent() -> None:
    """A start whose post is slow (a slow DNS answer or TLS handshake) is still through before the failure that
    followed it is posted. Before, each message had its own thread and the failure could arrive first."""
    got: list[str] = []

    def post(url: str, data: bytes, timeout: float) -> int:
        body = json.loads(data)
        if body["text"] == "start":
            time.sleep(0.3)
        got.append(body["text"])
        return 200

    hook, why = webhook(FAST, {"HOOK": "https://hooks.example.com/services/T/B/x"}, Path("/"))
    assert hook is not None, why
    n = Notifier(hook, post=post)
    n.send("start", {"text": "start"})
    n.send("failure", {"text": "failure"})
    assert n.close() == [] and got == ["start", "failure"]


def test_slack_text_carries_the_jobs_output_as_text_not_markup(tmp_path: Path, clean_env: None) -> None:
    """The review's payload: a log tail that closes the code block, then a channel-wide mention and a link whose
    shown text hides where it goes. Slack reads ``<...>`` as a mention or link and ``&`` as an entity (its rule:
    escape &, < and >), and a line of three backticks ends the fence: the tail stays text inside its block."""
    clock = Clock()
    rec = begin(project_settings(tmp_path), "run", HOSTS, environ={}, clock=clock)
    clock.tick(5)
    tail = ["step 1", "```", "<!channel> <https://evil.example/reset|Cluster maintenance: re-authenticate here>",
            "a & b", "````"]  # fmt: skip
    for line in tail:
        rec.line(1, line)
    rec.failed(1, 3, "node 1 failed with exit code 3 <!here>")
    rec.finish(3)
    said = payload("failure", store.load(rec.dir), "slack", clock.now)["text"]
    assert "<" not in said and ">" not in said  # no mention, no link: Slack shows them as typed
    assert "&lt;!channel&gt; &lt;https://evil.example/reset|Cluster" in said and "a &amp; b" in said
    assert "&lt;!here&gt;" in said
    body = said.split("\n```\n", 1)[1]
    assert body.endswith("\n```") and "```" not in body.removesuffix("\n```")  # the only fence is nodekit's own
    # Plain JSON is for scripts, not Slack: its fields keep the job's lines as they were.
    full = payload("failure", store.load(rec.dir), "json", clock.now)
    assert full["log_tail"] == tail


def test_a_refused_run_is_told_as_refused_with_its_reason_not_as_failed(tmp_path: Path, clean_env: None) -> None:
    from nodekit.errors import UsageError

    with pytest.raises(UsageError), recording(project_settings(tmp_path), "run", HOSTS, warn=lambda _: None) as rec:
        raise UsageError("main = '192.0.2.77' is none of node 0's addresses", fix="main = ... in nodekit.toml")
    text = payload("failure", store.load(rec.dir), "slack", time.time())["text"]
    assert "was refused before any node started (exit code 2): main = '192.0.2.77' is none of" in text, text
    assert "FAILED" not in text
