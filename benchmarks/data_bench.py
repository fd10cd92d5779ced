"""`make bench` (part): `nodekit data push` against parallel rsync over SSH (issue 45 item 8), on the virtual
cluster (tests/cluster harness: a head and up to 8 hosts, each its own network namespace with Debian's sshd), every
link limited to ``--mbit`` (tc tbf on both ends of every veth, as benchmarks/ship_bench.py does).

1. A dataset of about 2 GB (20,000 files of 50 KiB on average in directories of 1,000, and four of 256 MiB), made
   here once; ``--scale`` shrinks it where the disk or the time does not allow (the number of small files and the
   size of the large ones; a small file keeps its size, so what costs per file stays per file).
2. To 1, 2, 4 and 8 hosts: `nodekit data push` (the CLI run on the head, as a user runs it: whatever path it takes,
   one stream per host or a relay) and then, into other directories, SkyPilot's way (the anchor): `rsync -az` from
   the head to every host at once over the same SSH. After each tool's first push: a push that changes nothing, one
   small file changed, one large file renamed. Each with its wall time and the bytes the head's veth sent.
3. Small against large: the small files alone, then one file of their total size, to 1 host: each one's rate.
4. A no-change push of ``--scan-files`` tiny files (100,000 by default) to 1 host: the scan's time.

The head's hash of each source is made once before the timings (a `--dry-run`), as a user's repeated pushes find it.
Every host's copy lives in its own directory on this machine's one file system (``[nodes.R] mounts``), as it would on
its own disk; nodekit's copy is checked by the node against the source's manifest (the push fails otherwise).
Needs root, a Docker engine install (the harness starts a dockerd per host), sshd (`make sshd`) and rsync.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._databench import STEPS, TITLE, Shape, disk_need, section, size, steps_of
from benchmarks._project import DOCS, busy_cpu_s, loadavg, now_utc, replace_section

NAME = "nkdb"
TIMEOUT_S = 1800


def _write(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        while n > 0:
            chunk = os.urandom(min(n, 8 << 20))
            f.write(chunk)
            n -= len(chunk)


def make_dataset(root: Path, shape: Shape) -> None:
    """The dataset under ``root``, reused when a run of the same shape made it (random bytes: no codec shrinks them)."""
    marker = root.parent / f"{root.name}.shape.json"
    want = json.dumps(shape.__dict__)
    if root.is_dir() and marker.is_file() and marker.read_text() == want:
        return
    shutil.rmtree(root, ignore_errors=True)
    for i in range(shape.files):
        _write(root / shape.small_name(i), shape.small_size(i))
    for i in range(shape.large):
        _write(root / shape.large_name(i), shape.large_mib << 20)
    marker.write_text(want)


def make_tiny(root: Path, files: int) -> None:
    marker = root.parent / f"{root.name}.count"
    if root.is_dir() and marker.is_file() and marker.read_text() == str(files):
        return
    shutil.rmtree(root, ignore_errors=True)
    for i in range(files):
        _write(root / f"d{i // 1000:03d}" / f"{i:06d}.txt", 512 + i % 1024)
    marker.write_text(str(files))


def make_one(path: Path, n: int) -> None:
    if path.is_file() and path.stat().st_size == n:
        return
    shutil.rmtree(path.parent, ignore_errors=True)
    _write(path, n)


class Bench:
    """The virtual cluster, the projects that push a source to its hosts, and the two tools."""

    def __init__(self, work: Path, hosts: int, mbit: int, relay: str | None = None) -> None:
        from benchmarks._shipcluster import ShipCluster

        self.work, self.mbit, self.relay = work, mbit, relay
        self.cluster = ShipCluster(NAME, hosts, "classic", work)

    def __enter__(self) -> Bench:
        self.cluster.__enter__()
        try:
            if self.mbit:
                self.cluster.shape(self.mbit)
        except BaseException:
            self.cluster.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.down()

    @property
    def env(self) -> dict[str, str]:
        return {**self.cluster.head_env, "SSH_AUTH_SOCK": ""}  # no user agent, as in CI

    def dests(self, tool: str, n: int) -> list[Path]:
        return [self.work / "on" / tool / t.name for t in self.cluster.targets[:n]]

    def project(self, source: Path, dests: Sequence[Path]) -> Path:
        """The project whose one mount's source is ``source``, now to as many hosts as ``dests``, each into its own:
        one project per source, so that its hash cache (in the project) is made once."""
        project = self.work / "projects" / f"{source.parent.name}-{source.name}"
        project.mkdir(parents=True, exist_ok=True)
        hosts = [f"ssh://root@{t.addr}" for t in self.cluster.targets[: len(dests)]]
        toml = ['name = "databench"', 'script = "train.py"', f"nnodes = {len(dests)}", f"hosts = {json.dumps(hosts)}",
                "", "[[mounts]]", f'source = "{source}"', 'host = "/unused"', 'container = "/data"']  # fmt: skip
        for rank, d in enumerate(dests):
            toml += ["", f"[nodes.{rank}]", f'mounts = {{ "/data" = "{d}" }}']
        (project / "nodekit.toml").write_text("\n".join(toml) + "\n")
        (project / "train.py").write_text("print('hi')\n")
        return project

    def nodekit(self, project: Path, *extra: str) -> dict[str, Any]:
        """`nodekit data push` on the head: seconds, the head's link bytes, the payload nodekit counted."""
        argv = [sys.executable, "-m", "nodekit", "data", "push", "--config", str(project / "nodekit.toml"), *extra]
        argv += ["--relay", self.relay] if self.relay else []
        before, cpu = self.cluster.head_tx(), busy_cpu_s()
        t0 = time.monotonic()
        done = self.cluster.head.run(*argv, env=self.env, cwd=project, timeout=TIMEOUT_S)
        seconds = time.monotonic() - t0
        after, cpu = self.cluster.head_tx(), busy_cpu_s() - cpu
        out = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            raise SystemExit(f"nodekit data push failed ({done.returncode}):\n{out[-3000:]}")
        last = out.splitlines()[-1] if out else ""
        found, relayed = re.search(r"sent (\d+) bytes", last), re.search(r"(\d+) relayed by other hosts", last)
        return {
            "seconds": round(seconds, 2),
            "link_bytes": after - before,
            "sent": int(found.group(1)) if found else None,
            "relayed": int(relayed.group(1)) if relayed else 0,
            "busy": busy_share(cpu, seconds),
        }

    def rsync(self, source: Path, dests: Sequence[Path]) -> dict[str, Any]:
        """SkyPilot's way: one `rsync -az --delete` from the head to every host at once, over the same SSH."""
        ssh = str(self.cluster.bin_dir / "ssh")
        h0 = self.cluster.head
        for d in dests:
            d.parent.mkdir(parents=True, exist_ok=True)  # rsync makes the last directory only
        before, cpu = self.cluster.head_tx(), busy_cpu_s()
        t0 = time.monotonic()
        procs = [
            subprocess.Popen(h0.argv("rsync", "-az", "--delete", "-e", ssh, f"{source}/", f"root@{t.addr}:{d}/"),
                             env=h0.env(self.env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for t, d in zip(self.cluster.targets, dests, strict=False)
        ]  # fmt: skip
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
        seconds = time.monotonic() - t0
        after, cpu = self.cluster.head_tx(), busy_cpu_s() - cpu
        for p, out in zip(procs, outs, strict=True):
            if p.returncode != 0:
                raise SystemExit(f"rsync failed ({p.returncode}):\n{out[-3000:]}")
        return {"seconds": round(seconds, 2), "link_bytes": after - before, "busy": busy_share(cpu, seconds)}


class Local:
    """``--local``: this machine alone, no cluster and no link (so no lock on the virtual cluster): `nodekit data push
    --to unix://...` into a directory here, the receiver run by this machine's python3. It shows the head's and the
    receiver's own cost per file (hashing, the disk, the stream's framing), not a link's; small against large and the
    no-change scan only."""

    def __init__(self, work: Path) -> None:
        self.work = work

    def dests(self, tool: str, n: int) -> list[Path]:
        return [self.work / "on" / tool / "local"]

    def project(self, source: Path, dests: Sequence[Path]) -> Path:
        project = self.work / "projects" / f"local-{source.parent.name}-{source.name}"
        project.mkdir(parents=True, exist_ok=True)
        toml = ['name = "databench"', 'script = "train.py"', "nnodes = 1", "", "[[mounts]]", f'source = "{source}"',
                f'host = "{dests[0]}"', 'container = "/data"']  # fmt: skip
        (project / "nodekit.toml").write_text("\n".join(toml) + "\n")
        (project / "train.py").write_text("print('hi')\n")
        return project

    def nodekit(self, project: Path, *extra: str) -> dict[str, Any]:
        argv = [sys.executable, "-m", "nodekit", "data", "push", "--to", "unix:///var/run/docker.sock", "--config",
                str(project / "nodekit.toml"), *extra]  # fmt: skip
        t0 = time.monotonic()
        done = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=TIMEOUT_S)
        seconds = time.monotonic() - t0
        if done.returncode != 0:
            raise SystemExit(f"nodekit data push failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
        return {"seconds": round(seconds, 2), "link_bytes": 0}


def busy_share(cpu_s: float, seconds: float) -> float:
    """How busy this machine's cores were over ``seconds`` in which they spent ``cpu_s`` (every virtual host runs on
    them: a push to 8 hosts that keeps them all busy measures this machine, not the hosts' links)."""
    return round(cpu_s / max(seconds, 1e-3) / (os.cpu_count() or 1), 2)


def clear(paths: Sequence[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def _log(what: str, r: dict[str, Any]) -> None:
    print(f"{what}: {r['seconds']:.1f} s, head's link {size(r['link_bytes'])}", flush=True)


def one_tool(bench: Bench, tool: str, n: int, data: Path, shape: Shape, steps: Sequence[str], k: int) -> dict[str, Any]:
    """The first push of ``data`` to ``n`` hosts with ``tool``, then ``steps`` (each changes the source first; ``k``
    picks which files, so that each tool meets a change of its own)."""
    dests = bench.dests(tool, n)
    clear(dests)
    project = bench.project(data, dests)
    push = (lambda: bench.nodekit(project)) if tool == "nodekit" else (lambda: bench.rsync(data, dests))
    out: dict[str, Any] = {}
    for step in steps:
        if step == "change":
            i = (97 * k + 13) % shape.files
            _write(data / shape.small_name(i), shape.small_size(i))
        elif step == "rename":
            names = sorted(p.name for p in data.glob("*.parquet"))
            old = data / names[k % len(names)]
            old.rename(old.with_name(f"renamed-{k}-{old.name}"))
        out[step] = push()
        _log(f"{tool} {step} to {n}", out[step])
    clear(dests)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="the dataset's size against the issue's 2 GB")
    ap.add_argument("--hosts", default="1,2,4,8")
    ap.add_argument("--mbit", type=int, default=1000, help="every link's rate (0: unshaped)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"of {', '.join(STEPS)}")
    ap.add_argument("--scan-files", type=int, default=100_000, help="the no-change scan's files (0: skip it)")
    ap.add_argument("--no-small-large", action="store_true")
    ap.add_argument("--settle-s", type=float, default=SETTLE_S, help="before small against large's small files, "
                    "sync and wait this long for earlier deletions to age out (see SETTLE_S)")  # fmt: skip
    ap.add_argument("--no-rsync", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/nodekit-data-bench"))
    ap.add_argument("--local", action="store_true", help="small against large and the scan on this machine alone")
    ap.add_argument("--keep", action="store_true", help="keep the generated datasets for the next run")
    ap.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/benchmarks.md")
    ap.add_argument("--relay", choices=("auto", "always", "never"), default="auto", help="nodekit's --relay")
    ap.add_argument("--render", type=Path, help="print the section of a results file (results.partial.json of a "
                    "run cut off) and stop")  # fmt: skip
    args = ap.parse_args()
    if args.render:
        print(section(json.loads(args.render.read_text())))
        return 0
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is missing (the anchor): apt-get install -y rsync")
    counts = sorted(int(x) for x in args.hosts.split(","))
    steps = steps_of(["first", *(s for s in args.steps.split(",") if s and s != "first")])
    shape = Shape.of(args.scale)
    args.work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.work).free
    need = disk_need(shape, counts[-1], args.scan_files)
    if need > free:
        raise SystemExit(f"{args.work} has {size(free)} free; this run needs about {size(need)}: pass a smaller "
                         f"--scale (or --hosts, --scan-files)")  # fmt: skip
    results: dict[str, Any] = {"measured": now_utc(), "load_start": loadavg(), "scale": args.scale,
                               "shape": shape.__dict__, "total": shape.total, "mbit": args.mbit,
                               "disk_free": free, "disk_need": need, "runs": {},
                               "command": " ".join(["benchmarks/data_bench.py", *sys.argv[1:]])}  # fmt: skip
    t_start = time.monotonic()
    data = args.work / "src" / "data"
    print(f"making the dataset: {shape.files} files + {shape.large} x {shape.large_mib} MiB = {size(shape.total)}",
          flush=True)  # fmt: skip
    make_dataset(data, shape)
    if args.local:
        results["mode"] = "local"
        try:
            local = Local(args.work)
            if not args.no_small_large:
                results["small_large"] = small_large(local, args.work, data, shape, args.settle_s)
            if args.scan_files:
                results["scan"] = scan(local, args.work, args.scan_files)
        finally:
            clear([args.work / "on", args.work / "projects"])
            if not args.keep:
                clear([args.work / "src", args.work / "one", args.work / "tiny"])
        return finish(args, results, t_start)
    try:
        with Bench(args.work, counts[-1], args.mbit, args.relay) as bench:
            hashed_at = time.monotonic()
            bench.nodekit(bench.project(data, bench.dests("nodekit", 1)), "--dry-run")
            results["head_hash_s"] = round(time.monotonic() - hashed_at, 1)
            if not args.no_small_large:  # first: before this run has deleted any host's copy (see SETTLE_S)
                results["small_large"] = small_large(bench, args.work, data, shape, args.settle_s)
                partial(args, results, t_start)
            for k, n in enumerate(counts):
                run = results["runs"][str(n)] = {}
                for j, tool in enumerate(["nodekit", *([] if args.no_rsync else ["rsync"])]):
                    run[tool] = one_tool(bench, tool, n, data, shape, steps, 2 * k + j)
                    partial(args, results, t_start)
            if args.scan_files:
                results["scan"] = scan(bench, args.work, args.scan_files)
    finally:
        clear([args.work / "on", args.work / "projects"])
        if not args.keep:
            clear([args.work / "src", args.work / "one", args.work / "tiny"])
    return finish(args, results, t_start)


def partial(args: argparse.Namespace, results: dict[str, Any], t_start: float) -> None:
    """What is measured so far, for ``--render`` when a run is cut off (the lock's time limit, a failed step)."""
    done = {**results, "load_end": loadavg(), "run_minutes": round((time.monotonic() - t_start) / 60, 1)}
    (args.work / "results.partial.json").write_text(json.dumps(done, indent=1))


def finish(args: argparse.Namespace, results: dict[str, Any], t_start: float) -> int:
    results.update(load_end=loadavg(), run_minutes=round((time.monotonic() - t_start) / 60, 1))
    name = "results-local.json" if results.get("mode") == "local" else "results.json"
    (args.work / name).write_text(json.dumps(results, indent=1))
    text = section(results)
    print(text)
    if not args.no_docs and results.get("mode") != "local":
        DOCS.write_text(replace_section(DOCS.read_text(), TITLE, text))
    return 0


SETTLE_S = 370
"""ext4 without a journal (this machine's root file system) does not hand out an inode freed in the last 60 s, nor one
freed in the last 360 s whose inode table block is dirty (``recently_deleted`` in the kernel's ``find_inode_bit``):
a push that creates 20,000 files soon after 20,000 were deleted scans past them for each new file, up to 0.5 ms per
file in the kernel (seen with perf), and how much it meets depends on which block group its directory lands in. So
the small files' push runs before this run deletes any host's copy, after a sync and this long for the deletions of
whatever ran before (a previous run's cleanup) to age out. The large file's push creates one file: a sync only."""


def settle(seconds: float) -> None:
    """What was deleted and written before written out (``sync``), then ``seconds`` to pass (:data:`SETTLE_S`)."""
    os.sync()
    if seconds > 0:
        time.sleep(seconds)


def small_large(bench: Bench | Local, work: Path, data: Path, shape: Shape, settle_s: float) -> dict[str, Any]:
    """The small files alone, then one file of their total size, each a first push to 1 host; the small files' after
    the deletions before it have settled (``settle_s``: :func:`settle`)."""
    shards = data / "shards"
    total = sum(p.stat().st_size for p in shards.rglob("*") if p.is_file())
    one = work / "one" / "data" / "all.bin"
    make_one(one, total)
    rates = {}
    for what, source in (("small", shards), ("large", one.parent)):
        dests = bench.dests("nodekit", 1)
        clear(dests)
        project = bench.project(source, dests)
        bench.nodekit(project, "--dry-run")  # the head's hash, made before the timing as for every push here
        settle(settle_s if what == "small" else 0)
        r = bench.nodekit(project)
        _log(f"{what} files to 1", r)
        rates[what] = total / r["seconds"]
        clear(dests)
    return {"files": sum(1 for p in shards.rglob("*") if p.is_file()), "bytes": total, "settle_s": settle_s,
            "small_rate": rates["small"], "large_rate": rates["large"]}  # fmt: skip


def scan(bench: Bench | Local, work: Path, files: int) -> dict[str, Any]:
    """A no-change push of ``files`` tiny files to 1 host: the head's and the node's scans, nothing sent."""
    tiny = work / "tiny" / "data"
    make_tiny(tiny, files)
    dests = bench.dests("nodekit", 1)
    clear(dests)
    project = bench.project(tiny, dests)
    _log(f"{files} tiny files, first push", bench.nodekit(project))
    r = bench.nodekit(project)
    _log(f"{files} tiny files, no change", r)
    clear(dests)
    return {"files": files, **r}


if __name__ == "__main__":
    sys.exit(main())
