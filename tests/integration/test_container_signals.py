"""A signal to a node's container is a stop, not a crash (issue 28, item 5), on the real engine: `docker kill -s
HUP|INT|TERM` and `docker stop`, each to a node in the middle of training. The signalled node exits 128 + the
signal with one line naming it; a node whose peer was stopped names that peer as stopped by the signal (not as
failed, and not itself) and exits 19. Before: HUP and TERM gave exit 1 with torchrun's traceback and the others said
"node 1 failed with exit code 1"; INT made the signalled node exit 19 and main blame itself.

Cheap shape: the four cases run at the same moment, as separate jobs on one engine (each its own compose project and
ports, so no job's stop reaches another): the INT case as a two-node job (main is the one that blamed itself), the
other three as one-node jobs (the signalled node's own exit and line; tests/unit/launcher/test_stops.py holds the
others' side for every signal)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodekit.config.settings import load
from nodekit.image.builder import current_image
from tests.integration.helpers import nodekit

pytestmark = pytest.mark.docker

ARGS = '["--epochs", "100000", "--epoch-delay", "0.2", "--samples", "256"]'
# (project, nodes, master port, how its node 1 (two nodes) or node 0 (one) is stopped, the exit code it must have)
CASES = [
    ("int", 2, 29700, ["kill", "--signal", "INT"], 130, "SIGINT"),
    ("hup", 1, 29710, ["kill", "--signal", "HUP"], 129, "SIGHUP"),
    ("term", 1, 29720, ["kill", "--signal", "TERM"], 143, "SIGTERM"),
    ("stop", 1, 29730, ["stop"], 143, "SIGTERM"),
]


def project(ddp: Path, base: Path, key: str) -> Path:
    """The demo project under another name (so its own compose projects), running the demo's image."""
    dest = base / key
    dest.mkdir()
    for name in ("train.py", "nodekit.lock"):
        (dest / name).write_bytes((ddp / name).read_bytes())
    text = (ddp / "nodekit.toml").read_text().replace('name = "ddp-demo"', f'name = "sig-{key}"')
    (dest / "nodekit.toml").write_text(text)
    return dest


def container(key: str, rank: int) -> str:
    out = subprocess.run(["docker", "ps", "--all", "--quiet", "--filter",
                          f"label=com.docker.compose.project=nodekit-sig-{key}-node{rank}"],
                         capture_output=True, text=True).stdout.split()  # fmt: skip
    assert len(out) == 1, f"node {rank} of {key}: {out}"
    return out[0]


def logs(cid: str) -> str:
    got = subprocess.run(["docker", "logs", cid], capture_output=True, text=True)
    return got.stdout + got.stderr


def test_a_signal_to_a_node_s_container_is_a_stop_that_every_node_names(ddp_project: Path, tmp_path: Path) -> None:
    image = current_image(load(ddp_project / "nodekit.toml"))
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    env["NODEKIT_ARGS"] = ARGS
    dirs = {key: project(ddp_project, tmp_path, key) for key, *_ in CASES}
    started = []
    try:
        for key, nodes, port, *_ in CASES:
            for rank in reversed(range(nodes)):
                argv = [sys.executable, "-m", "nodekit", "up", "--detach", "--node-rank", str(rank), "--main",
                        "127.0.0.1", "--nnodes", str(nodes), "--master-port", str(port), "--image", image,
                        "--config", str(dirs[key] / "nodekit.toml")]  # fmt: skip
                started.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for p in started:
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0, out.decode(errors="replace")
        training = {key: container(key, 0) for key, *_ in CASES}
        deadline = time.monotonic() + 240
        while waiting := [k for k, c in training.items() if "ddp-demo: first step done" not in logs(c)]:
            assert time.monotonic() < deadline, f"never trained: {waiting}"
            time.sleep(0.5)
        target = {key: container(key, nodes - 1) for key, nodes, *_ in CASES}
        signalled = time.monotonic()
        kills = [subprocess.Popen(["docker", *how, target[key]]) for key, _, _, how, _, _ in CASES]
        assert [k.wait(timeout=120) for k in kills] == [0] * len(kills)
        codes = {c: int(subprocess.run(["docker", "wait", c], capture_output=True, text=True, timeout=120).stdout)
                 for c in {*training.values(), *target.values()}}  # fmt: skip
        took = time.monotonic() - signalled
        said = {c: logs(c) for c in codes}
    finally:
        for key, nodes, *_ in CASES:
            for rank in range(nodes):
                nodekit("down", "--node-rank", str(rank), config=dirs[key] / "nodekit.toml")
    print(f"every container had exited {took:.1f} s after the signals")
    for key, _, _, _, code, name in CASES:
        log = said[target[key]]
        assert codes[target[key]] == code, f"{key}: exit {codes[target[key]]}\n{log[-3000:]}"
        assert f"nodekit: this node was stopped by {name} (a signal to its container" in log, log[-3000:]
        assert "SignalException" not in log, f"{key}: torchrun's traceback, as for a crash\n{log[-3000:]}"
    main = said[training["int"]]
    assert codes[training["int"]] == 19, main[-3000:]
    assert re.search(r"nodekit: node 1 \(127\.0\.0\.1, host [^)]*\) was stopped by SIGINT", main), main[-3000:]
    said_by_nodekit = [ln for ln in main.splitlines() if ln.startswith("nodekit:")]
    assert not [ln for ln in said_by_nodekit if "failed" in ln], said_by_nodekit
