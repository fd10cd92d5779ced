"""Operating a fleet on the virtual cluster, in one test over real SSH: during a 3-host `nodekit run`, `nodekit exec`
reaches host 2's container and every node's, `nodekit top --once --json` reports every node; afterwards `nodekit
runs` lists the run with its phases, and a webhook (in the head's namespace) that hangs on the start message still
gets the finish. A second run with a node killed (SIGKILL) is recorded with the failing node, rank and signal, the
webhook gets the failure with its last lines, and with ``keep_containers`` `nodekit exec` reaches the ended
container (a copy of it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodekit.launcher.contract import RENDEZVOUS_DONE
from nodekit.runs import store
from nodekit.runs.events import PHASES
from nodekit.runs.notify import TAIL_LINES
from nodekit.system import docker
from tests.cluster.helpers import ROOT, Demo, Fleet, finish, nodekit_argv, nothing_left, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.docker]
PORT = 18765


def messages(path: Path, count: int, timeout: float = 30) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.is_file() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return [json.loads(ln) for ln in lines]
        time.sleep(0.2)


def test_exec_top_records_and_the_webhook_during_and_after_runs(
    demo_everywhere: Demo, fleet: Fleet, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    c = fleet.cluster
    h0, _, h2 = c.hosts
    got = tmp_path / "webhook.jsonl"
    server = h0.popen(sys.executable, "-m", "tests.cluster.webhook", str(PORT), str(got), "--hang-first", cwd=ROOT,
                      log=tmp_path / "webhook.log")  # fmt: skip
    url = f"http://127.0.0.1:{PORT}/services/T0/B0/s3cr3t"
    env = {**fleet.env, "NK_HOOK": url}
    try:
        t0 = time.monotonic()
        project = fleet.project(demo_everywhere, tmp_path, args=["--epochs", "30", "--epoch-delay", "0.4"])
        with (project / "nodekit.toml").open("a") as f:
            f.write('[notify]\nurl_env = "NK_HOOK"\nformat = "json"\ntimeout_s = 2\nretries = 1\ndeadline_s = 6\n')

        def nodekit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
            return h0.run(*nodekit_argv(*args), env=env, cwd=project, timeout=timeout)

        log = tmp_path / "run.log"
        run = h0.popen(*nodekit_argv("run", "--image", demo_everywhere.ref), env=env, cwd=project, log=log)
        wait_for(log, "ddp-demo: first step done", run, 300)

        one = nodekit("exec", "-r", "2", "--", "sh", "-c", "hostname; ls /sys/class/net")
        assert one.returncode == 0, one.stdout + one.stderr
        name, *ifaces = one.stdout.split()
        assert name == h2.run("hostname").stdout.strip() and h2.iface in ifaces and h0.iface not in ifaces, one.stdout
        every = nodekit("exec", "--all", "--", "python", "-c", "import torch; print(torch.__version__)")
        assert every.returncode == 0, every.stdout + every.stderr
        assert sorted(every.stdout.splitlines()) == [f"[node {r}] 2.13.0+cpu" for r in range(3)], every.stdout
        t_top = time.monotonic()
        top = nodekit("top", "--once", "--json")
        record_property("top_once_seconds", round(time.monotonic() - t_top, 1))
        assert top.returncode == 0, top.stdout + top.stderr
        rows = json.loads(top.stdout)
        assert [(r["node"], r["state"]) for r in rows] == [(0, "running"), (1, "running"), (2, "running")], rows
        for r in rows:
            assert r["cpu_pct"] is not None and r["mem_bytes"] > 10 * 2**20 and r["problem"] == "", r
        code, out = finish(run, log, 400)
        assert code == 0, out[-5000:]
        assert "s3cr3t" not in out

        listed = json.loads(nodekit("runs", "--json").stdout)
        assert [(r["command"], r["state"], r["exit_code"], r["nodes"]) for r in listed] == [("run", "ok", 0, 3)]
        shown = json.loads(nodekit("runs", "show", "last", "--json").stdout)
        for n in shown["nodes"]:
            assert list(n["phases"]) == list(PHASES) and n["exit_code"] == 0, n
        # The record names the image by its identity (the same on either image store), not this engine's id.
        identity = docker.require_image(demo_everywhere.ref).identity
        assert shown["image_id"] == identity and len(shown["fingerprint"]) == 64
        record_dir = project / ".nodekit" / "runs" / shown["id"]
        samples = (record_dir / "samples.jsonl").read_text().splitlines()
        assert {json.loads(s)["rank"] for s in samples} == {0, 1, 2}, "top --once added its samples to the run"
        assert all("s3cr3t" not in p.read_text() for p in record_dir.iterdir())
        said = messages(got, 3)
        # The first try of the start message was never answered; its retry was (at least once, as webhooks go).
        assert [m["event"] for m in said] == ["start", "start", "finish"] and said[0] == said[1], said
        assert said[2]["exit_code"] == 0 and said[2]["duration_s"] > 0
        record_property("first_run_seconds", round(time.monotonic() - t0, 1))

        # A second run: node 2's container killed. Its containers are kept, so exec reaches them afterwards.
        t1 = time.monotonic()
        toml = (project / "nodekit.toml").read_text().replace('"--epochs", "30"', '"--epochs", "100000"')
        (project / "nodekit.toml").write_text("keep_containers = true\n" + toml)
        log = tmp_path / "run2.log"
        run = h0.popen(*nodekit_argv("run", "--image", demo_everywhere.ref), env=env, cwd=project, log=log)
        wait_for(log, "ddp-demo: epoch 0 done", run, 300)  # its checkpoint is written: exec finds it afterwards
        h2.docker("kill", *h2.running_containers())
        code, out = finish(run, log, 120)
        assert code == 137, out[-5000:]
        listed = json.loads(nodekit("runs", "--json").stdout)
        assert [(r["state"], r["exit_code"]) for r in listed] == [("failed", 137), ("ok", 0)], listed
        assert (listed[0]["failed_rank"], listed[0]["failed_host"], listed[0]["signal"]) == (
            2, f"root@{h2.addr}", "SIGKILL"
        )  # fmt: skip
        table = nodekit("runs").stdout
        assert f"node 2 (root@{h2.addr}) SIGKILL" in table.splitlines()[1], table
        said = messages(got, 5)
        failure = said[-1]
        assert (failure["event"], failure["rank"], failure["exit_code"], failure["signal"]) == (
            "failure", 2, 137, "SIGKILL"
        ), failure  # fmt: skip
        # The failure carries node 2's last lines: the last TAIL_LINES of its lines in the run's merged log (how many
        # come before its banner depends on the link check, which prints its matrix on a node only with a finding).
        tail = failure["log_tail"]
        shown = json.loads(nodekit("runs", "show", "last", "--json").stdout)
        merged = (project / ".nodekit" / "runs" / shown["id"] / store.LOG).read_text().splitlines()
        mine = [ln.removeprefix("[node 2] ") for ln in merged if ln.startswith("[node 2] ")]
        assert any(ln.startswith("nodekit ddp-demo: node 2/3") for ln in mine) and RENDEZVOUS_DONE in mine, mine
        assert isinstance(tail, list) and tail and tail == mine[-TAIL_LINES:], (tail, mine)
        after = nodekit("exec", "-r", "0", "--", "ls", "/outputs")
        assert after.returncode == 0 and "checkpoint.pt" in after.stdout.split(), after.stdout + after.stderr
        down = nodekit("down")
        assert down.returncode == 0, down.stdout + down.stderr
        record_property("second_run_seconds", round(time.monotonic() - t1, 1))
        nothing_left(c)
    finally:
        server.kill()
        server.wait()
