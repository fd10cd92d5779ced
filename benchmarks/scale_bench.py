"""`make bench` (part): the head's own cost of ``nodekit run`` at 64, 256 and 512 stand-in hosts (issue 48 item 5).

Every host is an address of one network namespace behind one real sshd (benchmarks/_standin.py): the head's whole
path runs as it does against real hosts (each host's connection opened, its check in one SSH command, the start's
``docker run``, a follower per node for the whole job, ``compose down`` through the docker CLI's ``ssh://``
transport), and each host's ``docker`` is a stand-in that answers at once. What is measured is the head: from the
command to "N host(s) ready" and "N node(s) started" (its own progress lines), to its end; its CPU seconds (it and
every process it started, ControlMaster masters included: this process is their subreaper and reaps them); and,
sampled every 0.25 s, the peak resident memory, open file descriptors and processes of that whole tree.

Not a test. Needs root, iproute2 and Debian's openssh-server; the stand-ins' sshd sessions share this machine's
cores with the head (the machine's busy CPU over the run is printed beside the head's).

    .venv/bin/python benchmarks/scale_bench.py [--hosts 64,256,512] [--state F]

Another OpenSSH beside the system's, alternating (OpenSSH 10's default key exchange on Debian bookworm, from
bookworm-backports, unpacked, not installed; both ends then use their own default):

    apt-get download openssh-client/bookworm-backports openssh-server/bookworm-backports   # with that suite listed
    for d in openssh-*.deb; do dpkg-deb -x "$d" /tmp/openssh10; done
    .venv/bin/python benchmarks/scale_bench.py --hosts 512 --openssh system,/tmp/openssh10 --rounds 2
"""

from __future__ import annotations

import argparse
import compileall
import ctypes
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._project import busy_cpu_s, copy_demo, exit_on_signals, loadavg, now_utc  # noqa: E402
from benchmarks._standin import Standins, head_docker, pids_under  # noqa: E402

REF = "nodekit/ddp-demo:standin"
PR_SET_CHILD_SUBREAPER = 36
READY = re.compile(r"(\d+) host\(s\) ready \(([\d.]+) s\)")
STARTED = re.compile(r"(\d+) node\(s\) started \(([\d.]+) s since the command\)")
FINISHED = re.compile(r"the job finished on (\d+) node\(s\) in ([\d.]+) s")


def hold_s(n: int) -> float:
    """How long after the command every stand-in job ends: past the start, so that every follower is alive at once."""
    return 15 + 0.1 * n


def tree(skip: list[int]) -> tuple[int, int, int]:
    """This process's descendants (the head and whatever it left, reparented here), not ``skip``'s: resident
    bytes, open descriptors and processes."""
    rss = fds = procs = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids_under(os.getpid(), skip):
        if pid == os.getpid():
            continue
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # an exited process this one has not reaped yet (it is their subreaper): not the head's
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            procs += 1
        except (OSError, ValueError, IndexError):
            continue
    return rss, fds, procs


def reap(skip: list[int], deadline_s: float = 30) -> None:
    """Wait for every orphan of the run (its connections' masters exit when the run ends)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with_kids = [p for p in pids_under(os.getpid(), skip) if p != os.getpid()]
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not with_kids:
            return
        time.sleep(0.1)
    print(f"scale bench: processes left after the run: {with_kids}", flush=True)


def sshd_cpu_s(pid: int) -> float:
    """The CPU seconds of sshd's ended sessions (its children's, which it waits for): the stand-ins' side."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


def own(pid: int) -> tuple[int, int]:
    """The head's own process: its open descriptors and threads."""
    try:
        threads = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Threads:"))
        return len(os.listdir(f"/proc/{pid}/fd")), int(threads.split()[1])
    except (OSError, StopIteration, ValueError):
        return 0, 0


def follow(tail: Any, p: subprocess.Popen[bytes]) -> None:
    """Read the run's log every 50 ms until it ends."""
    while p.poll() is None:
        tail.poll()
        time.sleep(0.05)


def one_run(n: int, project: Path, env: dict[str, str], log: Path, skip: list[int]) -> dict[str, Any]:
    from benchmarks.fleet_bench import Tail

    argv = [sys.executable, "-m", "nodekit", "run", "--image", REF, "--config", str(project / "nodekit.toml")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sshd0 = sshd_cpu_s(skip[0])
    busy0, t0 = busy_cpu_s(), time.monotonic()
    peak = {"rss": 0, "fds": 0, "procs": 0, "own_fds": 0, "threads": 0}
    with open(log, "w") as out:
        p = subprocess.Popen(argv, env=env, cwd=project, stdout=out, stderr=subprocess.STDOUT)
        tail = Tail(log, t0, marker="node(s) started")
        # The log is read on a thread of its own every 50 ms: the sampling below walks /proc for a thousand
        # processes at 512 hosts, and a line read only after it would be stamped late by one such walk.
        reading = threading.Thread(target=follow, args=(tail, p), daemon=True)
        reading.start()
        while p.poll() is None:
            if time.monotonic() - t0 > 300 + 3 * n:
                p.kill()
                p.wait()
                raise SystemExit(f"nodekit run on {n} stand-in hosts did not end within {300 + 3 * n} s; see {log}")
            got = dict(zip(("rss", "fds", "procs", "own_fds", "threads"), (*tree(skip), *own(p.pid)), strict=True))
            peak = {k: max(peak[k], got[k]) for k in peak}
            time.sleep(0.25)
    wall = time.monotonic() - t0
    reading.join()
    tail.poll()
    reap(skip)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = log.read_text(errors="replace")
    if p.returncode != 0:
        raise SystemExit(f"nodekit run on {n} stand-in hosts failed ({p.returncode}):\n{text[-4000:]}")
    ready, started, finished = READY.search(text), STARTED.search(text), FINISHED.search(text)
    last_line = max((t for t, ln in tail.lines if "final loss" in ln), default=float("nan"))
    return {
        "hosts": n,
        "ready_s": float(ready.group(2)) if ready else None,
        "started_s": float(started.group(2)) if started else None,
        "finished_s": float(finished.group(2)) if finished else None,
        "last_job_line_s": last_line,
        # Since the command, as this process read the lines (late by up to one sampling round): nodekit's own stamps
        # count from its check's start, after its Python start-up and after every host's connection was started.
        "ready_wall_s": tail.first("host(s) ready"),
        "started_wall_s": tail.first("node(s) started"),
        "hold_s": hold_s(n),
        "wall_s": wall,
        "cpu_user_s": after.ru_utime - before.ru_utime,
        "cpu_sys_s": after.ru_stime - before.ru_stime,
        "standins_cpu_s": sshd_cpu_s(skip[0]) - sshd0,
        "machine_busy_s": busy_cpu_s() - busy0,
        "peak_rss_mb": peak["rss"] / 2**20,
        "peak_fds": peak["fds"],
        "peak_procs": peak["procs"],
        "head_peak_fds": peak["own_fds"],
        "head_peak_threads": peak["threads"],
        "measured": now_utc(),
        "load": loadavg(),
    }


def row(r: dict[str, Any]) -> str:
    """The run's line of the table, after the OpenSSH and the code it ran (when they are recorded)."""
    cpu = r["cpu_user_s"] + r["cpu_sys_s"]
    stop = r["wall_s"] - r["last_job_line_s"]
    side = "".join(f"{r[k]} " for k in ("openssh", "code") if k in r)
    return (f"{side}| {r['hosts']} | {r['ready_wall_s']:.1f} s ({r['ready_s']:.1f}) | {r['started_wall_s']:.1f} s "
            f"({r['started_s']:.1f}) | {stop:.1f} s | {cpu:.1f} "
            f"({cpu / r['hosts']:.3f}) | {r['peak_rss_mb']:.0f} MB | {r['peak_fds']} | {r['peak_procs']} | "
            f"{r['head_peak_fds']} / {r['head_peak_threads']} | {r['standins_cpu_s']:.0f} | "
            f"{r['machine_busy_s']:.0f} in {r['wall_s']:.0f} s | {r['load']} |")  # fmt: skip


HEADER = (
    "| stand-in hosts | all ready, since the command (nodekit's stamp) | all started (nodekit's stamp) | "
    "the end: last job line to exit | head CPU s (per host) | "
    "head peak RSS (its whole tree) | peak fds (tree) | peak processes | head process: peak fds / threads | "
    "stand-ins' CPU s (sshd side) | machine busy CPU s | load after |\n"
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
)


def _use_openssh(standins: Standins, build: Path | None, ssh_bin: Path) -> str:
    """The stand-ins' sshd and the head's ssh from ``build`` (None: the system's); returns the client's version."""
    if build != standins.openssh:
        standins.use_openssh(build)
    wrapper = ssh_bin / "ssh"
    real = str(build / "usr/bin/ssh") if build is not None else shutil.which("ssh") or "/usr/bin/ssh"
    line = wrapper.read_text().splitlines()[1].split(" ", 2)
    wrapper.write_text(f"#!/bin/sh\nexec {real} {line[2]}\n")
    said = subprocess.run([real, "-V"], capture_output=True, text=True).stderr.strip()
    return said.split(",")[0].split()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="64,256,512")
    parser.add_argument("--state", type=Path, help="append each run's figures here (JSON lines)")
    parser.add_argument("--kex", default="", help="KexAlgorithms for the head's ssh config, as a user may set in "
                        "~/.ssh/config (default: OpenSSH's own, sntrup761x25519-sha512 in 9.2)")  # fmt: skip
    parser.add_argument("--openssh", default="system", help="OpenSSH builds to alternate, comma-separated: 'system' "
                        "or the root of unpacked openssh-client and openssh-server packages (dpkg-deb -x), whose ssh "
                        "the head runs and whose sshd the stand-ins run")  # fmt: skip
    parser.add_argument("--code", default="this", help="nodekit's code to alternate, comma-separated: 'this' (the "
                        "checkout this runs from) or another tree holding a nodekit package (a git worktree of an "
                        "earlier commit), which the head then imports first (PYTHONPATH)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every host count, OpenSSH and code, alternating")  # fmt: skip
    opts = parser.parse_args()
    counts = [int(x) for x in opts.hosts.split(",")]
    builds = [None if x == "system" else Path(x).resolve() for x in opts.openssh.split(",")]
    codes = [None if x == "this" else Path(x).resolve() for x in opts.code.split(",")]
    for tree in codes:
        if tree is not None and not (tree / "nodekit" / "__init__.py").is_file():
            raise SystemExit(f"--code {tree}: no nodekit package there")
    kex = opts.kex or "OpenSSH's default"
    exit_on_signals()
    for tree in (ROOT, *(c for c in codes if c is not None)):
        compileall.compile_dir(tree / "nodekit", quiet=1)
    work = Path(tempfile.mkdtemp(prefix="nodekit-scale-"))
    rows = []
    try:
        keys = {}
        for k in ("host", "client"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / k)], check=True)
            keys[k] = work / k
        with Standins(max(counts), work, (work / "client.pub").read_text(), keys["host"]) as s:
            from tests.cluster.harness import ssh_client

            hosts = [SimpleNamespace(addr=a) for a in s.addrs]
            ssh_bin = ssh_client(work / "ssh", hosts, keys["client"], (work / "host.pub").read_text())  # type: ignore[arg-type]
            if opts.kex:  # the user's choice, in the config nodekit's ssh reads; nodekit itself never sets it
                with open(work / "ssh" / "ssh_config", "a") as f:
                    f.write(f"  KexAlgorithms {opts.kex}\n")
            head_bin = work / "head"
            head_bin.mkdir()
            (head_bin / "docker").write_text(head_docker(shutil.which("docker") or "docker", s.state))
            (head_bin / "docker").chmod(0o755)
            env = {**os.environ, "PATH": f"{head_bin}:{ssh_bin}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": "",
                   "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}  # fmt: skip
            project = copy_demo("nodekit-scale-project-")
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            base = (project / "nodekit.toml").read_text()
            print(f"key exchange: {kex}\n{HEADER}", flush=True)
            sides = [(n, b, c) for _ in range(opts.rounds) for n in counts for b in builds for c in codes]
            for n, build, code in sides:
                ssh = _use_openssh(s, build, ssh_bin)
                skip = [s.sshd_pid or -1]  # the stand-ins' side: its sshd and sessions are not the head's
                keep = [ln for ln in base.splitlines() if not ln.startswith(("nnodes =", "hosts =", "args ="))]
                names = [f"ssh://root@{a}" for a in s.addrs[:n]]
                (project / "nodekit.toml").write_text("\n".join([*keep, f"nnodes = {n}", f"hosts = {json.dumps(names)}",
                                                                 'args = ["--epochs", "1"]']) + "\n")  # fmt: skip
                s.clear()
                s.set_job(REF, time.time() + hold_s(n))
                side_env = env if code is None else {**env, "PYTHONPATH": str(code)}
                r = one_run(n, project, side_env, work / f"run-{n}.log", skip)
                r["kex"], r["openssh"], r["code"] = kex, ssh, "this" if code is None else str(code)
                rows.append(r)
                print(row(r), flush=True)
                if opts.state:
                    with open(opts.state, "a") as f:
                        f.write(json.dumps(r) + "\n")
            shutil.rmtree(project.parent, ignore_errors=True)
    finally:
        if os.environ.get("NKS_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)
    print(HEADER)
    for r in rows:
        print(row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
