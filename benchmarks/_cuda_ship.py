"""The ship phase of benchmarks/cuda_bench.py: the CUDA image's three versions (a: whole, b: code change, c: package
change) to N virtual hosts over real SSH, relayed, beside a registry anchor; the head's link bytes, nodekit's own
count, and the disk the targets' loads held at their peak.

The head (h0) sends from this machine's default engine (its unix socket is reachable from h0's network namespace:
no 6 GB copy into h0's engine first). The registry anchor: one `docker-registry` process in this machine's namespace
on 127.0.0.1:5000, which the default engine pushes each version to once, and a second one in h0's namespace serving
the same storage directory to the targets, each through an `ssh -R` tunnel from h0 (as benchmarks/ship_bench.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = Path("/usr/bin/docker-registry")
REG_PORT = 5000
CLUSTER = "nkg"
SOURCE = "unix:///var/run/docker.sock"
DATA = Path("/var/lib/nodekit-cluster")
GIB = 1 << 30
HEADROOM = 8 * GIB  # left to the machine's other users while the targets hold their copies
PROBE = f"import socket; socket.create_connection(('127.0.0.1', {REG_PORT}), timeout=1).close()"


class DiskWatch:
    """The least free space seen on the targets' file system (every 0.5 s) while a push runs: the targets' data
    roots all live on this machine's disk, so the drop is what their loads held together at their peak."""

    def __init__(self, path: Path) -> None:
        self.path, self._stop = path, threading.Event()
        self.start = self.low = self.free()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.low = min(self.low, self.free())

    def __enter__(self) -> DiskWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    @property
    def peak_used(self) -> int:
        return max(0, self.start - self.low)


def _wait(check: Callable[[], bool], proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.2)


class ShipRun:
    """One ship phase: the cluster (1 + n hosts, sshd, shaped links), the pushes and pulls, the teardown."""

    def __init__(self, state: dict[str, Any], n: int, mbit: int, save: Callable[[dict[str, Any]], None]) -> None:
        from tests.cluster.harness import Cluster

        self.state, self.n, self.mbit, self.save = state, n, mbit, save
        built = state["build"]
        self.tags = {k: built[v]["tag"] for k, v in (("a", "v1"), ("b", "v2"), ("c", "v3"))}
        self.store = Path(built["project"]) / ".nodekit" / "blobs"
        self.work = Path(state["work"])
        self.rows: list[dict[str, Any]] = [r for r in state.get("ship_rows", []) if r["targets"] != n]
        self.facts: dict[str, Any] = dict(state.get("ship_facts", {}))
        self.cluster = Cluster(1 + n, name=CLUSTER, owner=os.getpid(), decoy=False)
        self.started: list[subprocess.Popen[bytes]] = []
        self.shaped: list[tuple[str, str]] = []
        self.head_env: dict[str, str] = {}
        self.bin_dir = Path()

    # -- the cluster --

    def up(self) -> None:
        from benchmarks._shipnet import tbf_argv
        from tests.cluster.harness import sh, ssh_client

        c = self.cluster
        c.up()
        ssh = self.work / "ssh"
        ssh.mkdir(parents=True, exist_ok=True)
        for key in ("host", "client"):
            if not (ssh / key).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / key)], check=True)
        self.bin_dir = ssh_client(ssh / "config", c.hosts, ssh / "client", (ssh / "host.pub").read_text())
        for h in c.hosts:
            h.start_sshd((ssh / "client.pub").read_text(), ssh / "host")
        self.head_env = {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}
        for h in c.hosts:
            for ns, dev in ((h.netns, h.iface), (c.switch, h.name)):
                sh("tc", "-n", ns, *tbf_argv(dev, self.mbit))
                self.shaped.append((ns, dev))

    def down(self) -> None:
        from tests.cluster.harness import sh

        for proc in reversed(self.started):  # tunnels, then the registries: only what this run started, by PID
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for ns, dev in self.shaped:
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        for h in self.cluster.hosts:
            h.stop_sshd()
        self.cluster.down(purge=True)  # never leave 6 GB copies in the virtual hosts' engines

    def head_tx(self) -> int:
        from benchmarks._shipnet import tx_bytes
        from tests.cluster.harness import sh

        h0 = self.cluster.main
        return tx_bytes(sh("ip", "-n", h0.netns, "-s", "-j", "link").stdout, h0.iface)

    def record(self, row: object, **more: object) -> None:
        self.rows.append({**dataclasses.asdict(row), **more})  # type: ignore[call-overload]
        self.state["ship_rows"] = self.rows
        self.save(self.state)
        print(f"cuda bench: {row} {more}", flush=True)

    # -- nodekit --

    def nk_push(self, case: str) -> None:
        from benchmarks._shipnet import Row

        h0, targets = self.cluster.main, self.cluster.hosts[1:]
        argv = [sys.executable, str(ROOT / "benchmarks" / "_ship_push.py"), "--source", SOURCE,
                "--store", str(self.store), "--relay", "auto", self.tags[case],
                *(f"ssh://root@{t.addr}" for t in targets)]  # fmt: skip
        before = self.head_tx()
        with DiskWatch(DATA) as disk:
            proc = h0.run(*argv, env=self.head_env, timeout=3600)
        after = self.head_tx()
        if proc.returncode != 0:
            raise SystemExit(f"push failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        skipped = sum(got["skipped"].values())
        relayed = f"relayed to {len(got['relayed'])} of {self.n}" if got.get("relayed") else ""
        note = ", ".join(filter(None, [f"layer files skipped: {skipped}" if skipped else "", relayed]))
        sent = sum(got["sent"].values())
        row = Row(case, "layers", self.n, self.mbit, round(got["seconds"], 1), after - before, sent, note)
        self.record(row, disk_peak=disk.peak_used)

    # -- the registry anchor --

    def registry(self) -> None:
        from benchmarks._project import default_engine_env

        regdir = self.work / "registry"
        (regdir / "data").mkdir(parents=True, exist_ok=True)
        config = regdir / "config.yml"
        config.write_text("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                          f"    rootdirectory: {regdir / 'data'}\nhttp:\n  addr: 127.0.0.1:{REG_PORT}\n")  # fmt: skip
        self._serve([], config, regdir / "log")
        here = [sys.executable, "-c", PROBE]
        _wait(lambda: subprocess.run(here, capture_output=True).returncode == 0, self.started[-1], "the registry")
        pushes: dict[str, float] = dict(self.facts.get("registry_push_s", {}))
        env = default_engine_env()
        for case, tag in self.tags.items():
            ref = f"localhost:{REG_PORT}/nodekit/cuda-bench:{case}"
            subprocess.run(["docker", "tag", tag, ref], check=True, env=env)
            t0 = time.monotonic()
            subprocess.run(["docker", "push", "-q", ref], check=True, env=env, capture_output=True, timeout=3600)
            pushes.setdefault(case, round(time.monotonic() - t0, 1))  # a version's first push is its cost
            subprocess.run(["docker", "rmi", ref], check=True, env=env, capture_output=True)
        self.facts["registry_push_s"] = pushes
        h0 = self.cluster.main
        self._serve(h0.argv(), config, regdir / "log-h0")
        _wait(lambda: h0.run("python3", "-c", PROBE).returncode == 0, self.started[-1], "the head's registry")
        for t in self.cluster.hosts[1:]:
            fwd = f"127.0.0.1:{REG_PORT}:127.0.0.1:{REG_PORT}"
            ssh = [str(self.bin_dir / "ssh"), "-N", "-o", "ExitOnForwardFailure=yes", "-R", fwd, f"root@{t.addr}"]
            with open(self.work / f"tunnel-{t.name}.log", "a") as log:
                self.started.append(subprocess.Popen(h0.argv(*ssh), stdout=log, stderr=log, env=h0.env(self.head_env)))
            _wait(lambda t=t: t.run("python3", "-c", PROBE).returncode == 0, None, f"the tunnel to {t.name}")
        blobs = regdir / "data" / "docker" / "registry" / "v2" / "blobs"
        self.facts["registry_bytes_all_versions"] = sum(p.stat().st_size for p in blobs.rglob("data"))

    def _serve(self, where: list[str], config: Path, log: Path) -> None:
        with open(log, "a") as f:
            self.started.append(subprocess.Popen([*where, str(REGISTRY), "serve", str(config)], stdout=f, stderr=f))

    def pull(self, case: str) -> None:
        from benchmarks._shipnet import Row

        targets = self.cluster.hosts[1:]
        ref = f"localhost:{REG_PORT}/nodekit/cuda-bench:{case}"
        before = self.head_tx()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            done = list(pool.map(lambda t: t.docker("pull", "-q", ref, timeout=3600, check=False), targets))
        pull_s = time.monotonic() - t0
        after = self.head_tx()
        for t, p in zip(targets, done, strict=True):
            if p.returncode != 0:
                raise SystemExit(f"pull on {t.name} failed: {p.stderr.strip()[-2000:]}")
        push_s = self.facts["registry_push_s"][case]
        note = f"head's docker push {push_s:.1f} s (once) + pulls {pull_s:.1f} s"
        self.record(Row(case, "registry", self.n, self.mbit, round(push_s + pull_s, 1), after - before, None, note))

    def wipe_targets(self) -> None:
        for t in self.cluster.hosts[1:]:
            for image_id in sorted(set(t.docker("images", "-q", "--no-trunc", "-a").stdout.split())):
                t.docker("rmi", "-f", image_id, check=False)


def phase_ship(state: dict[str, Any], n: int, mbit: int, save: Callable[[dict[str, Any]], None]) -> None:
    """Cases a, b, c to ``n`` targets with nodekit, then the same three versions through the registry."""
    if not isinstance(state.get("build"), dict):
        raise SystemExit("run --phase build first (the ship phase sends its three images)")
    size = int(state["build"]["v1"]["size"])
    free = DiskWatch(DATA if DATA.exists() else Path("/")).free()
    need = n * int(size * 2.2) + HEADROOM
    if free < need:
        raise SystemExit(f"{n} targets need about {need / GIB:.0f} GiB free on this disk, {free / GIB:.0f} GiB is")
    if not REGISTRY.is_file():
        raise SystemExit(f"{REGISTRY} is missing: apt-get install -y docker-registry")
    run = ShipRun(state, n, mbit, save)
    try:
        run.up()
        for case in "abc":
            run.nk_push(case)
        run.registry()
        run.wipe_targets()  # the registry's pulls start from empty nodes, as (a) did
        for case in "abc":
            run.pull(case)
    finally:
        run.down()
    run.facts["load"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    run.facts["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    state["ship_facts"] = run.facts
    save(state)
