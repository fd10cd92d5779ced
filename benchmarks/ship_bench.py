"""`make bench` (part): what it costs to get the demo image onto 1, 2 and 4 nodes over a network, on each of Docker's
image stores (issues 10 and 27): nodekit's push of only the layers a node lacks, beside a registry (the anchor a
registry user picks), and nodekit's push pipeline against the raw copy rate of the same bytes over the same SSH.

Not a test: it measures and writes its section of docs/benchmarks.md (run after benchmarks/run.py, which writes
the rest of that file). The virtual cluster (tests/cluster, cluster name ``nkb``) gets a head h0 and the targets,
each a network namespace with its own dockerd on the store measured and Debian's sshd; the head pushes over real SSH
(`ssh://root@<addr>`) from this machine's engine of that store (benchmarks/_shipcluster.py), so the bytes cross the
head's link; they are counted from its interface counters (`ip -s -j link`) besides nodekit's own count.

Cases: (a) the demo image to empty nodes, (b) one changed line of train.py, (c) one package added to the project's
packages (a pure-Python wheel; torch stays pinned at 2.13.0). The images are built once on the classic engine and
put on the containerd-store engine with nodekit's push (the same image: nodekit writes every layer above the base).

Phases (each fits one hold of the heavy lock; results accumulate in <work>/state.json, and the docs section is
written from it after every phase):

- ``build``: the three versions of the demo project (about 2 minutes).
- ``wire``: per store, unshaped links (no tc): the whole image to one empty node with each codec (``--compress``
  auto = zstd here, gzip, none), the raw copy of the same layer files (``cat | ssh node 'cat > /dev/null'``) before
  and after, and nodekit's compressor alone (about 4 minutes per store).
- ``ship``: per store, every link limited to ``--mbit`` (tc tbf): (a), (b), (c) to each count of targets, relayed as
  nodekit does by default, then the registry (the source engine pushes each version once; every target pulls through
  an SSH tunnel). About 10 minutes per store for counts 1,2,4.
- ``relay``: per store, the whole image (a) to 1 node and to the most targets, relayed, every link limited to
  ``--relay-mbit`` (40): slow enough that the wire, not this machine's shared cores, sets the pace, as on a cluster
  whose nodes have cores of their own; its own section of docs/benchmarks.md (about 4 minutes per store).
- ``clean``: the images this bench added to the engines, the registries' data, the project (``render``: only the
  section).

Needs root, the engines (make engine engine-containerd), sshd (make sshd) and docker-registry (apt-get install -y
docker-registry).

    nk-heavy .venv/bin/python benchmarks/ship_bench.py --phase ship --stores containerd --counts 1,2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._project import (  # noqa: E402
    build,
    copy_demo_to,
    default_engine_env,
    exit_on_signals,
    kept,
    loadavg,
    now_utc,
    read_state,
    write_state,
)
from benchmarks._shipnet import Row, parse_stores  # noqa: E402

WORK = Path(os.environ.get("NODEKIT_SHIP_BENCH_DIR", "/var/tmp/nodekit-ship-bench"))
STATE = WORK / "state.json"
EXTRA_PACKAGE = "six"  # pure Python, one small wheel
CLUSTER = "nkb"
REPO = "nodekit/ship-bench"


def save(state: dict[str, Any]) -> None:
    write_state(STATE, state)


def keep_row(state: dict[str, Any], key: str, row: Any, same: tuple[str, ...]) -> None:
    """``row`` into ``state[key]``, replacing a row of an earlier run that agrees on the fields ``same``; saved."""
    state[key] = kept(state.get(key, []), dataclasses.asdict(row), same)
    save(state)
    print(f"ship bench: {row}", flush=True)


def phase_build(state: dict[str, Any]) -> None:
    """The demo project at WORK/ddp, built three times on the classic engine: (a) as is, (b) one line of train.py
    changed, (c) a package added."""
    project = copy_demo_to(WORK / "ddp")
    tags = {}
    had = _refs()
    for case in "abc":
        if case == "b":
            train = project / "train.py"
            train.write_text(train.read_text() + "\n# one changed line: a code-only rebuild\n")
        if case == "c":
            cfg = project / "nodekit.toml"
            old = 'packages = ["torch==2.13.0", "numpy"]'
            assert old in cfg.read_text(), "examples/ddp's packages line changed: update ship_bench"
            cfg.write_text(cfg.read_text().replace(old, f'packages = ["torch==2.13.0", "numpy", "{EXTRA_PACKAGE}"]'))
            lock = [sys.executable, "-m", "nodekit", "lock", "--config", str(cfg)]
            subprocess.run(lock, check=True, env=default_engine_env(), capture_output=True)
        tags[case] = build(project, quiet=True)
    assert len(set(tags.values())) == 3, tags
    state.update(project=str(project), tags=tags, built=now_utc())
    mine = state.setdefault("added", {}).setdefault("classic", [])
    mine += [t for t in tags.values() if t not in had and t not in mine]
    print(f"ship bench: images {tags}", flush=True)


def _refs() -> set[str]:
    """Every repository:tag on the classic engine."""
    from benchmarks._shipcluster import CLASSIC_ENGINE

    fmt = "{{.Repository}}:{{.Tag}}"
    return set(subprocess.run(["docker", "-H", CLASSIC_ENGINE, "images", "--format", fmt], check=True,
                              capture_output=True, text=True).stdout.split())  # fmt: skip


def _built(state: dict[str, Any]) -> tuple[dict[str, str], Path]:
    if not isinstance(state.get("tags"), dict):
        raise SystemExit("run --phase build first (the other phases send its three images)")
    return dict(state["tags"]), Path(state["project"]) / ".nodekit" / "blobs"


def _source(state: dict[str, Any], store: str) -> str:
    """This machine's engine of ``store``, holding the three images (put there by nodekit's push when missing)."""
    from benchmarks._shipcluster import engine_of, stage
    from nodekit.image.plan import LABEL_BASE
    from nodekit.system import docker

    tags, blobs = _built(state)
    source = engine_of(store)
    if store != "classic":
        base = docker.require_image(tags["a"], None).labels.get(LABEL_BASE)
        added = stage(list(tags.values()), source, blobs, base)
        mine = state.setdefault("added", {}).setdefault(store, [])
        mine += [r for r in added if r not in mine]
        save(state)
    return source


def phase_wire(state: dict[str, Any], store: str, codecs: list[str]) -> None:
    """The push pipeline against the raw copy rate on ``store`` (benchmarks/_wirerun.py)."""
    from benchmarks import _wirerun

    tags, blobs = _built(state)
    source = _source(state, store)
    _wirerun.phase(state, store, codecs, cluster=CLUSTER, work=WORK, ref=tags["a"], source=source, blobs=blobs,
                   save=save)  # fmt: skip


def phase_ship(state: dict[str, Any], store: str, counts: list[int], opts: argparse.Namespace) -> None:
    """Cases a, b, c to each count of targets with nodekit, then the registry anchor, on one store."""
    from benchmarks._shipcluster import ShipCluster, registry_bytes, registry_push
    from nodekit.system import docker

    tags, blobs = _built(state)
    source = _source(state, store)
    t_start = time.monotonic()
    facts = state.setdefault("facts", {}).setdefault(store, {})
    run: dict[str, Any] = {"counts": counts, "load_start": loadavg()}
    facts.update(cores=os.cpu_count(), mbit=opts.mbit)
    identity = {case: docker.require_image(tag, source).identity for case, tag in tags.items()}
    regdir = WORK / f"registry-{store}"
    reg_ref = {case: f"localhost:5000/{REPO}:{case}" for case in tags}
    if opts.registry and ("registry_push_s" not in facts or not (regdir / "data" / "docker").is_dir()):
        facts["registry_push_s"] = registry_push(regdir, source, tags, REPO)
        facts["registry_bytes_all_versions"] = registry_bytes(regdir)
        save(state)

    def record(row: Row) -> None:
        keep_row(state, "rows", row, ("store", "case", "how", "targets", "mbit"))

    with ShipCluster(CLUSTER, max(counts), store, WORK) as c:
        facts["mem_available_gib_with_cluster"] = _mem_available_gib()

        def nk(case: str, targets: list[Any], mbit: int, *, how: str = "layers") -> None:
            got = c.push(tags[case], targets, source=source, blobs=None if how == "whole" else blobs,
                         relay="never" if how in ("direct", "whole") else "auto", whole=how == "whole")  # fmt: skip
            record(Row(case, how, len(targets), mbit, got.seconds, got.link_bytes, got.sent, got.note(len(targets)),
                       store))  # fmt: skip

        def pull(case: str, targets: list[Any], mbit: int) -> None:
            seconds, link = c.pull(reg_ref[case], targets, identity[case])
            push_s = facts["registry_push_s"][case]
            note = f"head's docker push {push_s:.1f} s (once) + pulls {seconds:.1f} s"
            record(Row(case, "registry", len(targets), mbit, round(push_s + seconds, 2), link, None, note, store))

        c.shape(opts.mbit)
        if opts.registry:
            c.registry_for_targets(regdir)
        for n in counts:
            targets = c.targets[:n]
            if opts.extras and n > 1:  # the head feeding every target itself, for comparison with the relay
                c.wipe(targets)
                nk("a", targets, opts.mbit, how="direct")
            c.wipe(targets)
            for case in "abc":
                nk(case, targets, opts.mbit)
            if opts.extras:  # every layer sent, as before issue 10
                for case in "bc":
                    c.remove(targets, [tags["c"], tags["b"]])
                    nk(case, targets, opts.mbit, how="whole")
            if opts.registry:
                c.wipe(targets)
                for case in "abc":
                    pull(case, targets, opts.mbit)
        if opts.slow_mbit:
            c.shape(opts.slow_mbit)
            one = c.targets[:1]
            c.remove(one, [tags["c"], tags["b"], reg_ref["c"], reg_ref["b"]])
            nk("b", one, opts.slow_mbit)
            if opts.registry:
                pull("b", one, opts.slow_mbit)
    facts["image_bytes"] = docker.require_image(tags["a"], source).size
    facts["layers"] = len(docker.require_image(tags["a"], source).layers)
    # What a push would cost if it read the image back out of the engine, as nodekit's did before its blob store.
    t0 = time.monotonic()
    subprocess.run(f"docker -H {source} save {tags['b']} > /dev/null", shell=True, check=True, timeout=600)
    facts["save_s"] = round(time.monotonic() - t0, 1)
    run.update(measured=now_utc(), load_end=loadavg(), run_minutes=round((time.monotonic() - t_start) / 60, 1))
    facts["runs"] = kept(facts.get("runs", []), run, ("counts",))
    save(state)


def phase_relay(state: dict[str, Any], store: str, counts: list[int], mbit: int) -> None:
    """The whole image (a) to 1 node and to the most targets, relayed, with every link at ``mbit``: slow enough that
    the wire, not this machine's shared cores, sets the pace, as on a cluster whose nodes each have their own."""
    from benchmarks._shipcluster import ShipCluster

    tags, blobs = _built(state)
    source = _source(state, store)
    facts = state.setdefault("relay_facts", {}).setdefault(store, {})
    facts.update(cores=os.cpu_count(), mbit=mbit, load_start=loadavg())
    most = max(counts)
    with ShipCluster(CLUSTER, most, store, WORK) as c:
        c.shape(mbit)
        for n in sorted({1, most}):
            targets = c.targets[:n]
            c.wipe(targets)
            got = c.push(tags["a"], targets, source=source, blobs=blobs, relay="auto")
            row = Row("a", "layers", n, mbit, got.seconds, got.link_bytes, got.sent, got.note(n), store)
            keep_row(state, "relay", row, ("store", "targets", "mbit"))
            print(f"ship bench: relay {store}: (a) to {n} at {mbit} Mbit/s: {got.seconds:.1f} s", flush=True)
    facts.update(measured=now_utc(), load_end=loadavg())
    save(state)


def _mem_available_gib() -> float:
    mem = Path("/proc/meminfo").read_text().split("\n")[2].split()[1]  # MemAvailable, kB
    return round(int(mem) / 1024 / 1024, 1)


def phase_clean(state: dict[str, Any]) -> None:
    """The images this bench added to each engine (by tag: the image goes with its last tag), the registries'
    storage, the project and its blob store, the base's layer files; the results stay."""
    import shutil

    from benchmarks._shipcluster import CLASSIC_ENGINE, CONTAINERD_ENGINE, remove_refs

    for store, refs in state.get("added", {}).items():
        remove_refs(refs, CONTAINERD_ENGINE if store == "containerd" else CLASSIC_ENGINE)
    state["added"] = {}
    for path in [*WORK.glob("registry-*"), WORK / "ddp", WORK / "base-layers", WORK / "ssh"]:
        shutil.rmtree(path, ignore_errors=True)
    for log in WORK.glob("tunnel-*.log"):
        log.unlink()
    for key in ("tags", "project"):
        state.pop(key, None)
    save(state)


def main() -> int:
    from benchmarks import _ship_render

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["all", "build", "wire", "ship", "relay", "clean", "render"],
                        default="all")  # fmt: skip
    parser.add_argument("--stores", default="classic,containerd", help="image stores (default both)")
    parser.add_argument("--counts", default="1,2,4", help="ship phase: target counts (default 1,2,4)")
    parser.add_argument("--mbit", type=int, default=1000, help="ship phase: link limit of every host (default 1000)")
    parser.add_argument("--slow-mbit", type=int, default=0, help="ship phase: case (b) again at this limit (0: not)")
    parser.add_argument("--relay-mbit", type=int, default=40,
                        help="relay phase: every link's limit, where the wire sets the pace (default 40)")  # fmt: skip
    parser.add_argument("--extras", action="store_true", help="ship phase: also (a) without relay and (b), (c) whole")
    parser.add_argument("--no-registry", dest="registry", action="store_false")
    parser.add_argument("--codecs", default="auto,gzip,none", help="wire phase: --compress values (default all)")
    parser.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/")
    opts = parser.parse_args()
    from benchmarks._wirerun import parse_codecs

    try:
        stores, codecs = parse_stores(opts.stores), parse_codecs(opts.codecs)
    except ValueError as e:
        parser.error(str(e))
    counts = sorted({int(n) for n in opts.counts.split(",")})
    exit_on_signals()
    for var in ("DOCKER_HOST", "DOCKER_CONTEXT"):  # builds and the classic store's pushes: this machine's engine
        os.environ.pop(var, None)
    state: dict[str, Any] = read_state(STATE)
    phases = (
        ["build", "wire", "ship", "relay", "clean"]
        if opts.phase == "all"
        else []
        if opts.phase == "render"
        else [opts.phase]
    )
    print(f"ship bench: work dir {WORK}", flush=True)
    for phase in phases:
        print(f"ship bench: phase {phase}", flush=True)
        if phase == "build":
            phase_build(state)
        elif phase == "clean":
            phase_clean(state)
        for store in stores if phase in ("wire", "ship", "relay") else ():
            if phase == "wire":
                phase_wire(state, store, codecs)
            elif phase == "ship":
                phase_ship(state, store, counts, opts)
            else:
                phase_relay(state, store, counts, opts.relay_mbit)
        save(state)
    # Each section is written from the rows this state holds, and left as it is where it holds none (a state that
    # only measured the relay keeps the shipping section an earlier run wrote).
    for section in (_ship_render.render(state) if state.get("rows") else "", _ship_render.render_relay(state)):
        print(section)
        if section and not opts.no_docs:
            _ship_render.write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
