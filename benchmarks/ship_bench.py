"""`make bench` (part): what it costs to get the demo image onto 1, 2 and 4 nodes over a network, per issue 10's
benchmark: nodekit's layer-level push, today's whole-image push, and a registry (the anchor a registry user picks).

Not a test: it measures and writes its section of docs/benchmarks.md (run after benchmarks/run.py, which writes
the rest of that file). The virtual cluster (tests/cluster) gets 5 hosts (cluster name ``nkb``): h0 is the head,
h1..h4 the targets, each a network namespace with its own dockerd and Debian's sshd. Every host's veth is limited
with `tc` (tbf, both directions) to 1 Gbit/s, and one case is repeated at 100 Mbit/s. The head pushes over real
SSH (`ssh://root@<addr>`, the docker CLI's ssh transport), so the bytes cross the head's link; they are counted
from its interface counters (`ip -s -j link`, tx bytes before/after) besides nodekit's own count.

Cases: (a) the demo image to empty nodes, (b) one changed line of train.py, (c) one package added to the
project's packages (a pure-Python wheel; torch stays pinned at 2.13.0). The registry is Debian's `docker-registry`
(the CNCF distribution registry), started here in h0's namespace on 127.0.0.1:5000; the head's engine pushes to
it, and every target pulls ``localhost:5000/...`` through an `ssh -R` tunnel the head opens to it (Docker accepts
plain HTTP for a localhost registry), so registry bytes cross the same limited link, inside SSH like nodekit's.

Needs root, a dockerd (make engine), sshd (make sshd) and docker-registry (apt-get install docker-registry).
Partial results land in <work dir>/rows.json as they are measured. About 25 minutes on 2 cores (one run
per case: already past the 15 minutes aimed at, so no repetitions).

    nk-heavy .venv/bin/python benchmarks/ship_bench.py [--counts 1,2,4] [--mbit 1000] [--slow-mbit 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._project import DOCS, build, copy_demo, default_engine_env, replace_section  # noqa: E402
from benchmarks._shipnet import Row, ordered, table, tbf_argv, tx_bytes, verdicts  # noqa: E402

TITLE = "## Shipping the image: whole vs only the layers a node lacks"
REGISTRY = Path("/usr/bin/docker-registry")
REG_PORT = 5000
EXTRA_PACKAGE = "six"  # pure Python, one small wheel
CLUSTER = "nkb"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="1,2,4", help="target node counts (default 1,2,4)")
    parser.add_argument("--mbit", type=int, default=1000, help="link limit of every host (default 1000)")
    parser.add_argument("--slow-mbit", type=int, default=100, help="the repeated case's limit (0: skip it)")
    parser.add_argument("--no-registry", action="store_true")
    parser.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/")
    parser.add_argument("--render", metavar="WORK_DIR", help="only write the section from a run's rows.json")
    opts = parser.parse_args()
    counts = [int(n) for n in opts.counts.split(",")]
    t_start = time.monotonic()
    if opts.render:
        done = Path(opts.render)
        rows = [Row(**r) for r in json.loads((done / "rows.json").read_text())]
        facts = json.loads((done / "facts.json").read_text())
        section = render(rows, facts, opts.mbit, opts.slow_mbit, counts)
        print(section)
        if not opts.no_docs:
            write_section(section)
        return 0
    if not opts.no_registry and not REGISTRY.is_file():
        raise SystemExit(f"{REGISTRY} is missing: apt-get install -y docker-registry (or pass --no-registry)")

    from tests.cluster.conftest import push_image
    from tests.cluster.harness import Cluster, Host, sh, ssh_client

    # --- the three images, built on the default engine --------------------------------------------------------
    project = copy_demo("nodekit-ship-bench-")
    work = project.parent
    print(f"ship bench: work dir {work}", flush=True)
    v1 = build(project, quiet=True)
    train = project / "train.py"
    train.write_text(train.read_text() + "\n# one changed line: a code-only rebuild\n")
    v2 = build(project, quiet=True)
    cfg = project / "nodekit.toml"
    old = 'packages = ["torch==2.13.0", "numpy"]'
    assert old in cfg.read_text(), "examples/ddp's packages line changed: update ship_bench"
    cfg.write_text(cfg.read_text().replace(old, f'packages = ["torch==2.13.0", "numpy", "{EXTRA_PACKAGE}"]'))
    lock = [sys.executable, "-m", "nodekit", "lock", "--config", str(cfg)]
    subprocess.run(lock, check=True, env=default_engine_env(), capture_output=True)
    v3 = build(project, quiet=True)
    assert len({v1, v2, v3}) == 3
    version = {"a": v1, "b": v2, "c": v3}
    print(f"ship bench: images {v1} {v2} {v3}", flush=True)

    rows: list[Row] = []
    facts: dict[str, object] = {}

    def record(row: Row) -> None:
        rows.append(row)
        (work / "rows.json").write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
        print(f"ship bench: {row}", flush=True)

    n_hosts = 1 + max(counts)
    c = Cluster(n_hosts, name=CLUSTER, owner=os.getpid(), decoy=False)
    started: list[subprocess.Popen[str]] = []  # the registry and the tunnels: stopped by PID below
    shaped: list[tuple[str, str]] = []
    c.up()
    try:
        h0, targets_all = c.hosts[0], c.hosts[1:]
        for v in (v1, v2, v3):
            push_image(v, None, [h0])
        ids = {k: h0.image_id(v) for k, v in version.items()}
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        subprocess.run([*keygen, "-f", str(work / "host")], check=True)
        subprocess.run([*keygen, "-f", str(work / "client")], check=True)
        bin_dir = ssh_client(work / "ssh", c.hosts, work / "client", (work / "host.pub").read_text())
        for h in c.hosts:
            h.start_sshd((work / "client.pub").read_text(), work / "host")
        head_env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
        mem = Path("/proc/meminfo").read_text().split("\n")[2].split()[1]  # MemAvailable, kB
        facts["mem_available_gib_with_cluster"] = round(int(mem) / 1024 / 1024, 1)

        def shape(mbit: int) -> None:
            for h in c.hosts:
                for ns, dev in ((h.netns, h.iface), (c.switch, h.name)):
                    sh("tc", "-n", ns, *tbf_argv(dev, mbit))
                    if (ns, dev) not in shaped:
                        shaped.append((ns, dev))

        def head_tx() -> int:
            return tx_bytes(sh("ip", "-n", h0.netns, "-s", "-j", "link").stdout, h0.iface)

        def remove(hosts: list[Host], *keys: str) -> None:
            for h in hosts:
                for k in keys:
                    h.docker("rmi", "-f", ids[k] or "", check=False)

        def wipe(hosts: list[Host]) -> None:
            for h in hosts:
                for image_id in sorted(set(h.docker("images", "-q", "--no-trunc", "-a").stdout.split())):
                    h.docker("rmi", "-f", image_id, check=False)

        def nk_push(case: str, targets: list[Host], mbit: int, *, whole: bool = False, relay: bool = True) -> Row:
            argv = [sys.executable, str(ROOT / "benchmarks" / "_ship_push.py"), "--source", h0.docker_host]
            # As `nodekit push` run in the project: the build's blob store carries a code change without a save.
            argv += ["--whole"] if whole else ["--store", str(project / ".nodekit" / "blobs")]
            argv += ["--relay", "auto" if relay else "never"]
            argv += [version[case], *(f"ssh://root@{t.addr}" for t in targets)]
            before = head_tx()
            proc = h0.run(*argv, env=head_env, timeout=900)
            after = head_tx()
            if proc.returncode != 0:
                raise SystemExit(f"push failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            skipped = sum(got["skipped"].values())
            note = f"layer files skipped: {skipped}" if skipped else ""
            if got.get("relayed"):
                note = ", ".join(filter(None, [note, f"relayed to {len(got['relayed'])} of {len(targets)}"]))
            how = "whole" if whole else "layers" if relay else "direct"
            row = Row(case, how, len(targets), mbit, got["seconds"], after - before,
                      sum(got["sent"].values()), note)  # fmt: skip
            record(row)
            return row

        reg_push_s: dict[str, float] = {}

        def reg_ref(case: str) -> str:
            return f"localhost:{REG_PORT}/nodekit/ddp-demo:{case}"

        def reg_pull(case: str, targets: list[Host], mbit: int) -> Row:
            before = head_tx()
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=len(targets)) as pool:
                done = list(pool.map(lambda t: t.docker("pull", reg_ref(case), timeout=900, check=False), targets))
            pull_s = time.monotonic() - t0
            after = head_tx()
            for t, p in zip(targets, done, strict=True):
                if p.returncode != 0 or t.image_id(reg_ref(case)) != ids[case]:
                    raise SystemExit(f"pull on {t.name} failed: {p.stderr.strip()[-2000:]}")
            push_s = reg_push_s[case]
            note = f"head's docker push {push_s:.1f} s (once) + pulls {pull_s:.1f} s"
            row = Row(case, "registry", len(targets), mbit, push_s + pull_s, after - before, None, note)
            record(row)
            return row

        shape(opts.mbit)
        if not opts.no_registry:
            regdir = work / "registry"
            (regdir / "data").mkdir(parents=True)
            (regdir / "config.yml").write_text(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {regdir / 'data'}\nhttp:\n  addr: 127.0.0.1:{REG_PORT}\n"
            )
            started.append(h0.popen(str(REGISTRY), "serve", str(regdir / "config.yml"), log=regdir / "log"))
            probe = f"import socket; socket.create_connection(('127.0.0.1', {REG_PORT}), timeout=1).close()"
            deadline = time.monotonic() + 20
            while h0.run("python3", "-c", probe).returncode != 0:
                if started[-1].poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"docker-registry did not start: {(regdir / 'log').read_text()[-2000:]}")
                time.sleep(0.2)
            for case in "abc":  # the head pushes each version once, as a registry user would after each build
                h0.docker("tag", version[case], reg_ref(case))
                t0 = time.monotonic()
                h0.docker("push", reg_ref(case), timeout=900)
                reg_push_s[case] = time.monotonic() - t0
                print(f"ship bench: registry push {case}: {reg_push_s[case]:.1f} s", flush=True)
            blobs = regdir / "data" / "docker" / "registry" / "v2" / "blobs"
            facts["registry_bytes_all_versions"] = sum(p.stat().st_size for p in blobs.rglob("data"))
            for t in targets_all:  # the target's localhost:5000 leads to the head's registry, through SSH
                ssh = [str(bin_dir / "ssh"), "-N", "-o", "ExitOnForwardFailure=yes"]
                fwd = f"127.0.0.1:{REG_PORT}:127.0.0.1:{REG_PORT}"
                started.append(h0.popen(*ssh, "-R", fwd, f"root@{t.addr}", log=work / f"tunnel-{t.name}.log"))
            for t in targets_all:
                deadline = time.monotonic() + 20
                while t.run("python3", "-c", probe).returncode != 0:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the tunnel to {t.name} did not open")
                    time.sleep(0.2)

        for n in counts:
            targets = targets_all[:n]
            if n > 1:  # the same first push with the head feeding every target itself, for comparison
                wipe(targets)
                nk_push("a", targets, opts.mbit, relay=False)
            wipe(targets)
            nk_push("a", targets, opts.mbit)
            nk_push("b", targets, opts.mbit)
            nk_push("c", targets, opts.mbit)
            remove(targets, "c", "b")
            nk_push("b", targets, opts.mbit, whole=True)
            nk_push("c", targets, opts.mbit, whole=True)
            if not opts.no_registry:
                wipe(targets)
                for case in "abc":
                    reg_pull(case, targets, opts.mbit)
        if opts.slow_mbit:
            shape(opts.slow_mbit)
            one = targets_all[:1]
            remove(one, "c", "b")
            nk_push("b", one, opts.slow_mbit)
            remove(one, "b")
            nk_push("b", one, opts.slow_mbit, whole=True)
            if not opts.no_registry:
                remove(one, "b")
                reg_pull("b", one, opts.slow_mbit)
        facts["image_bytes"] = h0.docker("image", "inspect", "--format", "{{.Size}}", v1).stdout.strip()
        facts["layers"] = len(json.loads(h0.docker("image", "inspect", v1).stdout)[0]["RootFS"]["Layers"])
        # What a code-only push would cost without the build's blob store: the head's engine exports the whole
        # image (nodekit filters the layers out of that stream), whatever travels.
        t0 = time.monotonic()
        sh("sh", "-c", f"docker -H {h0.docker_host} save {v2} > /dev/null", timeout=600)
        facts["save_s"] = round(time.monotonic() - t0, 1)
    finally:
        for proc in reversed(started):  # tunnels, then the registry: only what this run started, by PID
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for ns, dev in shaped:
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        for h in c.hosts:
            h.stop_sshd()
        c.down(purge=True)
    facts["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    facts["load"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    facts["run_minutes"] = round((time.monotonic() - t_start) / 60)
    (work / "facts.json").write_text(json.dumps(facts, indent=1))
    section = render(rows, facts, opts.mbit, opts.slow_mbit, counts)
    print(section)
    if not opts.no_docs:
        write_section(section)
    return 0


def render(rows: list[Row], facts: dict[str, object], mbit: int, slow_mbit: int, counts: list[int]) -> str:
    from benchmarks._shipnet import find, mib

    a1 = find(rows, "a", "layers", 1, mbit)
    b1 = find(rows, "b", "layers", 1, mbit)
    image_wire = a1.nodekit_bytes if a1 is not None else None
    code_wire_s = b1.link_bytes * 8 / (mbit * 1e6) if b1 is not None else None
    size = int(str(facts.get("image_bytes", "0")) or 0)
    load = f"load {facts['load']} at the end; " if "load" in facts else ""
    took = f" The whole run took {facts['run_minutes']} minutes." if "run_minutes" in facts else ""
    lines = [
        TITLE,
        "",
        f"Measured {facts.get('measured')} by `benchmarks/ship_bench.py` ({load}"
        f"{os.cpu_count()} cores shared by every host; {facts.get('mem_available_gib_with_cluster')} GiB "
        f"memory still available with the {1 + max(counts)}-host cluster up). The virtual cluster's head (h0) sends "
        f"the demo image (examples/ddp, {size / 1e6:.0f} MB, {facts.get('layers')} layers) to "
        f"{', '.join(map(str, counts))} target hosts over real SSH (`ssh://root@<addr>`); every host's veth is limited "
        f"with `tc` tbf to {mbit} Mbit/s in both directions. One run per row (no repetitions: every case is "
        f"kept, and the whole run is already longer than the 15 minutes aimed at).{took}",
        "",
        "- *head's link sent*: tx bytes of h0's interface (`ip -s -j link`) before and after: what crossed the "
        "head's uplink, SSH and TCP included.",
        "- *nodekit counted*: the compressed (gzip, nodekit's choice over a network) bytes nodekit wrote into the "
        "targets' `docker load`s "
        "(PushResult.sent).",
        "- *whole image (before)*: the same push with every layer sent, as nodekit did before issue 10 (the "
        "target's engine then skips what it has, after it crossed the wire). Case (a) is not repeated this way: on "
        "empty nodes both send every layer.",
        "- *relayed*: from 2 targets on, when 64 MiB or more travel (`--relay auto`), the targets pass the stream "
        "on to each other (a chain over SSH, nodekit/ship/relay.py) and the head sends it once; *no relay*: case "
        "(a) once more with `--relay never`, the head feeding every target itself, as before.",
        "- *registry*: Debian's `docker-registry` (the CNCF distribution registry) on the head's 127.0.0.1:"
        f"{REG_PORT}; the head's engine pushes each version once (gzip, as `docker push` does; that time is "
        "added to every row of that version), each target `docker pull`s `localhost:5000/...` through an `ssh -R` "
        "tunnel from the head, in parallel. Docker accepts plain HTTP for a localhost registry, so no "
        "`--insecure-registry` is needed and the registry's bytes cross the head's link inside SSH like nodekit's.",
        "- (b) is one line appended to train.py; (c) adds the pure-Python package `six` to the project's packages "
        "(`nodekit lock`, `nodekit build`; torch stays 2.13.0). Each case starts from the previous version on the "
        "targets: (a) empty nodes, (b) nodes with (a)'s image, (c) nodes with (b)'s.",
        "",
        *table(ordered(rows)),
        "",
        "Targets of issue 10, against these rows:",
        "",
        *verdicts(rows, mbit=mbit, image_wire=image_wire, code_wire_s=code_wire_s),
        "",
    ]
    lines += why(rows, facts, mbit, slow_mbit)
    if image_wire:
        lines.append(f"The image's compressed size is taken as nodekit's gzip stream to one empty node "
                     f"({mib(image_wire)}); the registry's gzip blobs for all three versions took "
                     f"{mib(int(str(facts.get('registry_bytes_all_versions', 0))))}.")  # fmt: skip
        lines.append("")
    lines += [
        "Reproduce (root; about 25 minutes on 2 cores; needs `make engine sshd` and `apt-get install -y "
        "docker-registry`; the cluster is named `nkb` and is torn down, data purged, at the end, also on failure):",
        "",
        "```sh",
        "sudo .venv/bin/python benchmarks/ship_bench.py     # or: make bench (runs it last)",
        "```",
        "",
    ]
    return "\n".join(lines)


def why(rows: list[Row], facts: dict[str, object], mbit: int, slow_mbit: int) -> list[str]:
    """The measured reasons behind the verdicts, one paragraph each (only for what was measured)."""
    from benchmarks._shipnet import find, mib

    out = ["Why, from these measurements:", ""]
    b1, b4 = find(rows, "b", "layers", 1, mbit), find(rows, "b", "layers", 4, mbit)
    rb4 = find(rows, "b", "registry", 4, mbit)
    where = facts.get("save_where", "h0's engine")
    save = f"{facts['save_s']} s for this image on {where}" if "save_s" in facts else "not timed in this run"
    if b1 is not None and b4 is not None:
        out.append(
            f"- (b): nodekit sends {mib(b4.nodekit_bytes or 0)} to 4 nodes ({mib(b4.link_bytes)} on the head's link, "
            f"SSH included) in {b4.seconds:.1f} s ({b1.seconds:.1f} s to one node). The code layer and the image "
            "config travel from the blob store `nodekit build` keeps (it writes the image's last layer itself, "
            f"nodekit/image/append.py), so the head runs no `docker save` ({save}: the fixed cost before this "
            "change). What remains is per target: six `docker -H ssh://` calls (the engine's facts, then three "
            "survey questions at once, then the load and the image id check) over one SSH connection per node "
            "(nodekit/ship/mux.py shares it with ControlMaster: one login per node instead of seven), each still a "
            "docker CLI process on the head and a `docker system dial-stdio` on the target. On this machine all of "
            "them, for every target, share the same 2 cores, which is why the time grows with the number of "
            "targets; on a cluster each target's side runs on its own CPU. "
            + (f"A registry pull of the same change takes {rb4.seconds:.1f} s ({rb4.extra}) because the daemon "
               "fetches only missing blobs and the head's `docker push` only uploads new ones." if rb4 else "")
        )  # fmt: skip
    a1, a4 = find(rows, "a", "layers", 1, mbit), find(rows, "a", "layers", 4, mbit)
    d4 = find(rows, "a", "direct", 4, mbit)
    if a1 is not None and a4 is not None:
        direct = (f" Without the relay (`--relay never`, the head feeding each target itself) the head's link "
                  f"carried {mib(d4.link_bytes)} in {d4.seconds:.1f} s." if d4 is not None else "")  # fmt: skip
        out.append(
            f"- (a), head's bytes and time: the targets form a relay chain (nodekit/ship/relay.py): the head streams "
            f"the image once, to the first node, and each node passes it on over SSH while it loads it, so the "
            f"head's link carried {mib(a4.link_bytes)} for 4 nodes against {mib(a1.link_bytes)} for one.{direct} "
            "The time is bound by CPU, not by the links: all 5 hosts share this machine's 2 cores, which run "
            "every node's decompression and unpacking and every hop's SSH encryption at once "
            f"({a1.seconds:.1f} s to one node for {mib(a1.link_bytes)}, which the {mbit} Mbit/s link carries in "
            f"{a1.link_bytes * 8 / mbit / 1e6:.1f} s); on a cluster each node does its own share on its own CPU."
        )
    c1, c4 = find(rows, "c", "layers", 1, mbit), find(rows, "c", "layers", 4, mbit)
    if c1 is not None:
        out.append(
            "- (c): adding a package rebuilds the packages layer (every pin but the framework's: 174 MB uncompressed "
            f"for the demo) and the small layers above it: nodekit sends those ({mib(c1.nodekit_bytes or 0)} to one "
            "node); the framework layer (torch, 776 MB) and the base stay on the nodes. The packages layer is "
            "BuildKit's, so this push still starts with a `docker save` of the whole image on the head."
            + (f" To 4 nodes the head's link carried {mib(c4.link_bytes)}: what travels is under the relay's "
               "64 MiB threshold (`--relay auto`), so the head feeds each node itself (`--relay always` would "
               "chain them)." if c4 is not None and not c4.extra.count("relayed") else "")
        )  # fmt: skip
    slow = [r for r in rows if r.mbit == slow_mbit and r.mbit != mbit]
    if slow:
        parts = ", ".join(f"{r.how} {r.seconds:.1f} s ({mib(r.link_bytes)})" for r in slow)
        out.append(
            f"- At {slow_mbit} Mbit/s, case (b) to one node: {parts}. The slower link changes only what the bytes "
            "cost: the whole image is then bound by the wire, the layer-level push is not."
        )
    out.append("")
    return out


def write_section(section: str) -> None:
    DOCS.write_text(replace_section(DOCS.read_text(), TITLE, section))


if __name__ == "__main__":
    sys.exit(main())
