"""Fixtures of the run-record tests: a clean environment, and a local HTTP server that plays a webhook (answers, fails
with 500, or hangs), started by the test itself on 127.0.0.1 and a free port."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

Mode = Literal["ok", "500", "hang", "hang-first"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_NAME", "NODEKIT_RUNS_KEEP", "NODEKIT_NOTIFY"):
        monkeypatch.delenv(var, raising=False)


@dataclass
class Hook:
    """A webhook server: what it received (decoded JSON bodies, in order) and its URL."""

    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def webhook() -> Iterator[Any]:
    """``webhook(mode)`` starts a server: ``ok`` answers 200, ``500`` always fails, ``hang`` reads each request and
    never answers (until the test ends), ``hang-first`` hangs on the first request only."""
    servers: list[tuple[http.server.ThreadingHTTPServer, Hook]] = []

    def start(mode: Mode) -> Hook:
        hook = Hook(url="")

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.requests += 1
                first = hook.requests == 1
                hook.received.append(json.loads(body))
                if mode == "hang" or (mode == "hang-first" and first):
                    hook.release.wait(60)
                    return
                self.send_response(500 if mode == "500" else 200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        hook.url = f"http://127.0.0.1:{server.server_address[1]}/services/T000/B000/s3cr3t-token"
        servers.append((server, hook))
        return hook

    yield start
    for server, hook in servers:
        hook.release.set()
        server.shutdown()
        server.server_close()
