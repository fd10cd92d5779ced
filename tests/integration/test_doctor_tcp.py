"""A real TCP round trip between doctors on loopback: main's doctor listening vs a closed port, told apart.

No Docker needed: the engine check is replaced where doctor is called in-process, and the command-line test
uses a project whose image does not exist, so no container is started.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nodekit import doctor as doc
from nodekit.config.settings import Settings
from nodekit.doctor import CheckRow, EngineCheck, Status, gathering, handshake
from nodekit.doctor.handshake import Reach
from nodekit.system.host import net

LOOPBACK = "127.0.0.1"
DOCTOR = [sys.executable, "-m", "nodekit", "doctor"]


def free_port_pair() -> int:
    """A port p with p and p + 1 free on this host (the rendezvous and preflight ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
        if port < 65535 and not net.port_in_use(port) and not net.port_in_use(port + 1):
            return port
    raise RuntimeError("no free port pair")


def settings(port: int, tmp_path: Path) -> Settings:
    return Settings(project_dir=tmp_path, name="doctortest", nnodes=2, master_port=port)


@pytest.fixture
def no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gathering, "_engine", lambda: EngineCheck(error="skipped in this test", failed="engine"))


class Listening:
    """Main's doctor serving in a thread, as `nodekit doctor --node-rank 0 --listen N` does."""

    def __init__(self, s: Settings, seconds: float = 10.0) -> None:
        self.ready = threading.Event()
        self.result: CheckRow | None = None
        self.thread = threading.Thread(target=self._run, args=(s, seconds), daemon=True)
        self.thread.start()
        assert self.ready.wait(5), "main's doctor did not start listening"

    def _run(self, s: Settings, seconds: float) -> None:
        self.result = doc.serve(s, main_ip=LOOPBACK, seconds=seconds, host=LOOPBACK, on_ready=self.ready.set)

    def join(self) -> CheckRow:
        self.thread.join(15)
        assert self.result is not None
        return self.result


def reach_row(rows: list[CheckRow]) -> CheckRow:
    return next(r for r in rows if r.check == "reach main")


def test_round_trip_to_listening_main(tmp_path: Path, no_docker: None) -> None:
    port = free_port_pair()
    s = settings(port, tmp_path)
    main = Listening(s)
    started = time.monotonic()
    facts = doc.gather(s, main=LOOPBACK, rank=1)
    assert time.monotonic() - started < 10
    assert [p.reach for p in facts.probes] == [Reach.DOCTOR, Reach.DOCTOR]
    assert all(p.rtt_s is not None and p.rtt_s < 1 for p in facts.probes)
    assert facts.probes[0].clock_offset_s is not None and abs(facts.probes[0].clock_offset_s) < 0.5
    r = reach_row(doc.rows(facts))
    assert r.status is Status.PASS and "doctor answered" in r.detail
    # Main stops listening as soon as every worker has been through on both ports, long before its 10 s.
    verdict = main.join()
    assert verdict.status is Status.PASS and "node(s) 1" in verdict.detail
    assert time.monotonic() - started < 8


def test_closed_port_is_refused_not_timed_out(tmp_path: Path, no_docker: None) -> None:
    port = free_port_pair()
    facts = doc.gather(settings(port, tmp_path), main=LOOPBACK, rank=1)
    assert [p.reach for p in facts.probes] == [Reach.REFUSED, Reach.REFUSED]
    r = reach_row(doc.rows(facts))
    assert r.status is Status.FAIL and "connection refused" in r.detail and "port closed" in r.detail
    assert "node 0 must run on this same machine" in r.detail  # loopback main: all-local only
    assert f"--main {LOOPBACK} --node-rank 0 --listen" in (r.fix or "")


def test_a_port_held_by_something_else(tmp_path: Path, no_docker: None) -> None:
    """A listener that is not a doctor (a running job's store) is reported as open, and sent nothing."""
    port = free_port_pair()
    received: list[bytes] = []
    with socket.socket() as other:
        other.bind((LOOPBACK, port))
        other.listen()

        def accept() -> None:
            conn, _ = other.accept()
            with conn:
                conn.settimeout(3)
                received.append(conn.recv(100))

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        p = handshake.probe(LOOPBACK, port, hello="rank=1", greeting_timeout=0.5)
        t.join(5)
    assert p.reach is Reach.OPEN
    assert received == [b""]  # the probe closed without writing a byte
    facts = doc.gather(settings(port, tmp_path), main=LOOPBACK, rank=0)
    # Port closed again now; on main the check is that both ports are free.
    assert next(r for r in doc.rows(facts) if r.check == "ports on main").status is Status.PASS


def test_main_doctor_names_the_holder_of_its_port(tmp_path: Path, no_docker: None) -> None:
    port = free_port_pair()
    with socket.socket() as held:
        held.bind((LOOPBACK, port + 1))
        held.listen()
        facts = doc.gather(settings(port, tmp_path), main=LOOPBACK, rank=0)
    taken = [r for r in doc.rows(facts) if r.check == "ports on main"]
    assert len(taken) == 1 and taken[0].status is Status.FAIL
    assert f"port {port + 1} is already in use" in taken[0].detail


def run_cli(tmp_path: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DOCTOR, *args], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def rows_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    payload = json.loads(proc.stdout)
    return {r["check"]: r for r in payload["rows"]}


def test_two_doctor_processes(tmp_path: Path) -> None:
    """Main with --listen and a worker as separate `nodekit doctor` processes, then the worker against nothing."""
    port = free_port_pair()
    (tmp_path / "nodekit.toml").write_text(f'name = "doctortest"\nnnodes = 2\nmaster_port = {port}\n')
    main = subprocess.Popen(
        [*DOCTOR, "--main", LOOPBACK, "-r", "0", "--listen", "25", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (net.port_in_use(port) and net.port_in_use(port + 1)):
            assert main.poll() is None, main.communicate()
            assert time.monotonic() < deadline, "main's doctor never listened"
            time.sleep(0.1)
        started = time.monotonic()
        worker = run_cli(tmp_path, "--main", LOOPBACK, "-r", "1", "--json")
        assert time.monotonic() - started < 10
        reach = rows_of(worker)["reach main"]
        assert reach["status"] == "PASS", reach
        out, err = main.communicate(timeout=30)
    finally:
        if main.poll() is None:
            main.kill()
    workers = rows_of(subprocess.CompletedProcess([], main.returncode, out, err))["workers"]
    assert workers["status"] == "PASS" and "node(s) 1" in workers["detail"]
    closed = run_cli(tmp_path, "--main", LOOPBACK, "-r", "1", "--json")
    assert closed.returncode == 1
    reach = rows_of(closed)["reach main"]
    assert reach["status"] == "FAIL" and "connection refused" in reach["detail"]
