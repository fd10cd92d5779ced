"""Main's preflight port under attack on a real engine: two nodes of the example DDP job on this machine (main
127.0.0.1, as in test_two_node.py) and a client without the job secret in a third container on the same network.

The hostile client runs in a container of the job's own image, so it has torch and can speak TCPStore, the
protocol the preflight port spoke before (hostile.py says what it tries). Neither a flood nor a replay of a real
node's recorded session may change any node's verdict or exit code.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nodekit.config.settings import load
from nodekit.image.builder import current_image
from tests.integration.helpers import down, nodekit, wait_node

pytestmark = pytest.mark.docker
HERE = Path(__file__).resolve().parent


@contextmanager
def hostile(config: Path, *args: str, files: Path | None = None) -> Iterator[str]:
    """Start hostile.py with ``args`` in a container of the job's image on the host network (``files`` mounted at
    /files); yield its name. On leaving, the container is removed."""
    name = f"nodekit-hostile-{os.getpid()}-{args[0]}"
    image = current_image(load(config))
    mounts = ["-v", f"{HERE}:/hostile:ro"] + (["-v", f"{files}:/files:ro"] if files else [])
    started = subprocess.run(
        ["docker", "run", "-d", "--name", name, "--network", "host", "--user", "0", "--cap-add", "NET_RAW",
         *mounts, "--entrypoint", "python", image, "/hostile/hostile.py", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)


def stop_and_read(name: str) -> str:
    """Stop the hostile container (SIGTERM: it prints its summary) and return its output."""
    subprocess.run(["docker", "stop", "-t", "20", name], capture_output=True, timeout=120)
    logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=120)
    return logs.stdout


def wait_logs(name: str, needle: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60)
        if needle in logs.stdout:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never printed {needle!r}: {logs.stdout[-2000:]} {logs.stderr[-2000:]}")


def wait_raw_connections(name: str, at_least: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    seen = 0
    while time.monotonic() < deadline:
        logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60).stdout
        progress = [line for line in logs.splitlines() if line.startswith("progress ")]
        seen = json.loads(progress[-1].split(" ", 1)[1])["raw_connections"] if progress else 0
        if seen >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name}: only {seen} connections to main's port within {within:g} s")


def summary(output: str) -> dict[str, int]:
    line = output.strip().splitlines()[-1]
    return dict(json.loads(line))


def assert_trained(project: Path) -> None:
    result = json.loads((project / "outputs" / "result.json").read_text())
    assert result["nnodes"] == 2 and result["world_size"] == 2
    assert len(set(result["checksums"])) == 1 and result["checksums_equal"] is True


def test_a_client_without_the_secret_hammering_main_changes_nothing(ddp_project: Path) -> None:
    """Main starts first; the hostile client hammers its port (and, where the port speaks TCPStore, gets in and
    keeps overwriting what it can) before node 1 arrives, and all through the run."""
    config = ddp_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29680"]
    (ddp_project / "outputs" / "result.json").unlink(missing_ok=True)
    try:
        with hostile(config, "hammer", "29681") as attacker:
            bg = nodekit("up", "--node-rank", "0", *flags, "--detach", config=config)
            assert bg.returncode == 0, bg.stderr
            wait_raw_connections(attacker, 20)  # main's port is up and under attack
            with contextlib.suppress(AssertionError):  # a store that lets it in (the old one): let it write first
                wait_logs(attacker, "tcpstore in", within=5)
            fg = nodekit("up", "--node-rank", "1", *flags, config=config, timeout=300)
            assert fg.returncode == 0, fg.stdout + fg.stderr  # before waiting for main, which may wait long
            main_code = wait_node(config, 0)
            attack = summary(stop_and_read(attacker))
    finally:
        down(config)
    assert main_code == 0
    assert "nodekit preflight: ok, 2/2 nodes, identical stacks" in fg.stdout, fg.stdout
    assert_trained(ddp_project)
    print(attack, *[line for line in fg.stdout.splitlines() if "preflight" in line], sep="\n")
    assert attack["raw_connections"] > 50, attack  # the attack went on during the run
    assert attack["tcpstore_writes"] == 0, attack  # no TCPStore write was accepted


def test_a_replayed_session_of_a_real_node_changes_nothing(ddp_project: Path, tmp_path: Path) -> None:
    """Run A records what node 1 sends to main's preflight port (on the loopback interface); in run B of the same
    job (same secret) that recording is replayed to main before node 1 arrives, again and again."""
    config = ddp_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29690"]
    recording = tmp_path / "recorded-session.json"
    try:
        with hostile(config, "capture", "29691") as spy:
            wait_logs(spy, "ready")
            bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config)
            assert bg.returncode == 0, bg.stderr
            first = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=300)
            assert first.returncode == 0 and wait_node(config, 1) == 0, first.stdout + first.stderr
            captured = json.loads(stop_and_read(spy).strip().splitlines()[-1])["streams"]
        # Node 1's session: it names node 1's facts and never rank 0's claim, which main's own client (the old
        # store had one) publishes; key names cross the network readable in either protocol.
        raw = [base64.b64decode(s) for s in captured]
        streams = [base64.b64encode(s).decode() for s in raw if b"nodekit/facts/1" in s and b"nodekit/claim/0" not in s]
        assert len(streams) == 1, f"run A's worker session was not captured ({len(captured)} streams)"
        recording.write_text(json.dumps({"streams": streams}))
        down(config)
        (ddp_project / "outputs" / "result.json").unlink(missing_ok=True)
        bg = nodekit("up", "--node-rank", "0", *flags, "--detach", config=config)
        assert bg.returncode == 0, bg.stderr
        with hostile(config, "replay", "29691", f"/files/{recording.name}", files=tmp_path) as replayer:
            wait_logs(replayer, "replayed 3")  # thrown at main three times before node 1 arrives
            fg = nodekit("up", "--node-rank", "1", *flags, config=config, timeout=300)
            assert fg.returncode == 0, fg.stdout + fg.stderr  # before waiting for main, which may wait long
            main_code = wait_node(config, 0)
            attack = summary(stop_and_read(replayer))
    finally:
        down(config)
    assert main_code == 0
    assert "nodekit preflight: ok, 2/2 nodes, identical stacks" in fg.stdout, fg.stdout
    assert_trained(ddp_project)
    print(attack, f"recorded session: {len(base64.b64decode(streams[0]))} bytes", sep="\n")
    assert attack["replays"] >= 3, attack
