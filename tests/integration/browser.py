"""Debian's Chromium driven through chromedriver's WebDriver HTTP API with the standard library (no Selenium):
``Browser`` starts chromedriver on a free port of 127.0.0.1, opens one headless session with a fresh profile,
and ends both (by the PID it started) on close. Flags: headless, no sandbox (root in CI), no GPU, and none of
Chromium's own network traffic (background networking, component updates, sync, first-run)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.ports import quiet_ports

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")  # fmt: skip
REAL_BINARY = Path("/usr/lib/chromium/chromium")  # Debian's /usr/bin/chromium is a wrapper script around it


def missing() -> str | None:
    """Why no browser test can run here (None: it can)."""
    if shutil.which("chromedriver") is None or shutil.which("chromium") is None:
        return "no chromium/chromedriver (make chromium installs Debian's)"
    return None


def _free_port() -> int:
    """The browser's debugging port: not from the ephemeral range, which other tests' connections draw on."""
    return quiet_ports(1)[0]


class Browser:
    def __init__(self, profile: Path, log: Path, *, width: int = 1200, height: int = 900) -> None:
        self.port = _free_port()
        self._log = open(log, "wb")  # noqa: SIM115 (closed in close())
        self.driver = subprocess.Popen(
            ["chromedriver", f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready(30)
            binary = str(REAL_BINARY) if REAL_BINARY.is_file() else str(shutil.which("chromium"))
            caps = {"browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
                    "goog:chromeOptions": {"binary": binary, "args": [*FLAGS, f"--user-data-dir={profile}",
                                                                      f"--window-size={width},{height}"]}}  # fmt: skip
            self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except BaseException:
            self._end_driver()
            raise

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.code} {e.read()[:800]!r}") from None

    def _wait_ready(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.driver.poll() is not None:
                raise AssertionError(f"chromedriver exited with {self.driver.returncode}")
            try:
                if self._call("GET", "/status", timeout=2).get("ready"):
                    return
            except (OSError, AssertionError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"chromedriver was not ready within {seconds:.0f} s")

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def run(self, script: str) -> Any:
        """A script's return value (the body of a function)."""
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": []})

    def resize(self, width: int, height: int) -> None:
        self._call("POST", f"/session/{self.session}/window/rect", {"width": width, "height": height})

    def console(self) -> list[dict[str, Any]]:
        """What the page logged to its console, errors included (chromedriver's log endpoint)."""
        found: list[dict[str, Any]] = self._call("POST", f"/session/{self.session}/se/log", {"type": "browser"})
        return found

    def screenshot(self) -> bytes:
        return base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot"))

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}", timeout=20)
        finally:
            self._end_driver()

    def _end_driver(self) -> None:
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait()
        self._log.close()
