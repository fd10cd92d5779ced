"""`make bench` (part): the CUDA image (examples/cuda: PyPI's CUDA torch 2.14.1 and torchvision, about 6 GB)
built, changed and shipped on each of Docker's image stores, beside the demo image's figures
(benchmarks/ship_bench.py). Issues 21 and 27.

Phases, each short enough for one hold of the machine's heavy lock (about 15 minutes); results accumulate in
<work>/state.json and the docs section is written from it (``--phase render``, also after every phase). Each phase
checks the free disk first and refuses to start without enough (the whole run wants about 80 GB free at its peak:
the image is 6 GB per copy per engine):

- ``bump``: the layer split. A project at torch 2.14.0 / torchvision 0.29.0, then upgraded to 2.14.1 / 0.29.1: time
  of each build, which layers changed and their sizes, and whether the CUDA libraries' pins moved. It builds on a
  base of its own (nodekit/base:bookworm plus a file: another image id), so BuildKit's cache of other builds cannot
  answer for it.
- ``build``: cold build (``--no-cache``, wheelhouse filled), image size and layers, ``docker save`` time, no-op
  rebuild, a code-only change (one line of train.py) and a package change (``six`` added): their rebuild times. On
  the classic engine; the containerd store's phases put the three images on its engine with nodekit's push.
- ``wire --stores S``: links unshaped, the whole image to one node with each codec against the raw copy of the same
  bytes over the same SSH (issue 27, item 3).
- ``ship --stores S --counts N``: the virtual cluster's head sends the three versions (a: whole image to empty nodes,
  b: the code change, c: the package change) to N targets over real SSH, relayed, links limited to 1 Gbit/s.
- ``anchor --stores S --counts N``: the registry anchor of the same run (the store's engine pushes each version once,
  every target pulls through an SSH tunnel from the head).
- ``relay --stores S``: the whole image alone to 1 and to 4 empty nodes with every link at ``--relay-mbit`` (100
  Mbit/s: the wire takes longer than 4 loads need of the machine's 2 cores), the relay's 1.3x where the link and not
  the shared CPU sets the pace.
- ``clean``: the run's images on both engines, its base, the registries, the projects and their blob stores.

    nk-heavy .venv/bin/python benchmarks/cuda_bench.py --phase ship --stores containerd --counts 1
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._cuda_ship import DISK_FACTOR, check_disk  # noqa: E402
from benchmarks._project import default_engine_env, exit_on_signals, read_state, write_state  # noqa: E402

WORK = Path(os.environ.get("NODEKIT_CUDA_BENCH_DIR", "/var/tmp/nodekit-cuda-bench"))
STATE = WORK / "state.json"
PHASES = ["bump", "build", "stage", "wire", "ship", "anchor", "relay", "clean"]
EXAMPLE = ROOT / "examples" / "cuda"
RUN_BASE = "nodekit-bench/base"
OLD_TORCH = ("torch==2.14.0", "torchvision==0.29.0")
NEW_TORCH = ("torch==2.14.1", "torchvision==0.29.1")
EXTRA_PACKAGE = "six==1.17.0"
GIB = 1 << 30
# Estimates: the image in the engine, its layers again in the project's blob store, BuildKit's cache of the installs
# and the wheelhouse; the bump phase holds two torch versions' framework layers besides.
BUILD_NEED = 30 * GIB
BUMP_NEED = 35 * GIB


def save_state(state: dict[str, Any]) -> None:
    write_state(STATE, state)


def run(argv: list[str], *, timeout: float = 3600, quiet: bool = True) -> tuple[float, str]:
    """Run ``argv`` on the default engine; (seconds, stdout + stderr). SystemExit naming it when it fails."""
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=quiet, text=True, timeout=timeout, env=default_engine_env())
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{(proc.stdout or '')[-2000:]}"
                         f"\n{(proc.stderr or '')[-3000:]}")  # fmt: skip
    return round(seconds, 1), (proc.stdout or "") + (proc.stderr or "")


def nk(project: Path, *args: str) -> tuple[float, str]:
    return run([sys.executable, "-m", "nodekit", *args, "--config", str(project / "nodekit.toml")])


def tag_of(project: Path) -> str:
    return str(json.loads((project / ".nodekit" / "last-build.json").read_text())["tag"])


def image_size(ref: str) -> int:
    return int(run(["docker", "image", "inspect", "--format", "{{.Size}}", ref])[1].strip())


def layers(ref: str) -> list[dict[str, object]]:
    """The image's layers, base first: diff id, size and which step made it (docker history, matched to the diff
    ids as nodekit's push plan does: nodekit.ship.sized_layers)."""
    from nodekit.image.layers import EMPTY_LAYER
    from nodekit.ship import sized_layers

    out = run(["docker", "history", "--no-trunc", "--human=false", "--format", "{{.CreatedBy}}\t{{.Size}}", ref])[1]
    steps = [ln.rsplit("\t", 1) for ln in reversed(out.strip().splitlines())]
    diff_ids = json.loads(run(["docker", "image", "inspect", ref])[1])[0]["RootFS"]["Layers"]
    sized = sized_layers(diff_ids, [int(size) for _, size in steps])
    made = iter(by for by, size in steps if int(size) > 0)
    return [
        {"diff_id": layer.diff_id, "size": layer.size,
         "step": "workdir" if layer.diff_id == EMPTY_LAYER else step_name(next(made, "?"))}
        for layer in sized
    ]  # fmt: skip


def step_name(created_by: str) -> str:
    """Which layer a history entry (or a BuildKit log line) is: the package steps name their lock files."""
    for key, name in (("cudalibs", "CUDA libraries"), ("framework", "framework"), ("packages", "packages")):
        if f"/wheels/{key}.lock" in created_by or f"from={key}," in created_by:
            return name
    if "from=wheels," in created_by:
        return "packages"
    if "/etc/nodekit-bench" in created_by:
        return "bench base"
    if "COPY nodekit" in created_by:
        return "launcher"
    if "written by nodekit build" in created_by or "COPY . /workspace" in created_by:
        return "code"
    return "base"


def step_seconds(log: str) -> dict[str, float]:
    """BuildKit's own time per package layer (``#N DONE 123.4s`` after the step's ``RUN --mount=...from=X``).
    nodekit builds each package layer in a BuildKit build of its own, and each build numbers its steps from 1. Builds
    that run at once tag their lines with the layer's name (``framework | #12 ...``), so a step is its tag and
    number; untagged lines (one build at a time) are read in order, a number meaning the step last started under it."""
    step = r"(?:(\w+) \| )?#(\d+) "  # the optional tag, the step number
    open_steps: dict[tuple[str, str], str] = {}
    seconds: dict[str, float] = {}
    for line in log.splitlines():
        if m := re.search(step + r"\[[^\]]*\] RUN --mount=type=bind,from=(\w+)", line):
            open_steps[m[1] or "", m[2]] = m[3]
        # A CACHED step closes its step too (the pop), with no time to keep.
        elif (
            (m := re.search(step + r"(DONE ([\d.]+)s|CACHED)", line))
            and (ctx := open_steps.pop((m[1] or "", m[2]), None))
            and m[4]
        ):
            seconds[step_name(f"from={ctx},")] = float(m[4])
    return seconds


def run_base(state: dict[str, object]) -> str:
    """This run's base: nodekit/base:bookworm plus a layer of its own (the run's id in one file), so every layer
    built on it has its own chain: BuildKit's cache of other builds (the tests' images of the same lock, an earlier
    run) cannot answer for this run's steps, and what is measured is built. Kept in the state for the later phases;
    a label alone would not do (BuildKit keys the steps by the base's layers)."""
    tag = state.get("base")
    if isinstance(tag, str) and subprocess.run(["docker", "image", "inspect", tag], capture_output=True,
                                               env=default_engine_env()).returncode == 0:  # fmt: skip
        return tag
    run_id = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    tag = f"{RUN_BASE}:{run_id}"
    dockerfile = f"FROM nodekit/base:bookworm\nRUN echo {run_id} > /etc/nodekit-bench\n"
    proc = subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, "-"], input=dockerfile, text=True,
                          capture_output=True, env=default_engine_env(), timeout=300)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"cannot make the bench's base: {proc.stderr[-2000:]}")
    state["base"] = tag
    return tag


def fresh_project(name: str, packages: tuple[str, ...], base: str) -> Path:
    """examples/cuda copied to <work>/<name> on ``base``, with ``packages`` (and numpy), locked, wheels linked."""
    from tests import wheelcache

    project = WORK / name
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    toml = project / "nodekit.toml"
    text = toml.read_text()
    text = re.sub(r"^name = .*$", f'name = "{name}-bench"', text, flags=re.M)
    text = re.sub(r"^packages = .*$", "packages = " + json.dumps([*packages, "numpy"]), text, flags=re.M)
    toml.write_text(text + f'base_image = "{base}"\n')
    if packages != NEW_TORCH:  # the example's lock holds for any bookworm base (same Python, same platform)
        (project / "nodekit.lock").unlink()
        nk(project, "lock")
    wheelcache.prefill(project)
    return project


def build(project: Path, *flags: str) -> dict[str, object]:
    from tests import wheelcache

    seconds, log = nk(project, "build", "--create-base", "--verbose", *flags)  # step_seconds reads BuildKit's lines
    wheelcache.keep(project)
    tag = tag_of(project)
    return {"tag": tag, "seconds": seconds, "size": image_size(tag), "layers": layers(tag),
            "steps": step_seconds(log)}  # fmt: skip


def remove_images(name: str) -> None:
    """Every image of project ``name`` (its fingerprint tags and its ``env`` tag)."""
    fmt = "{{.Repository}}:{{.Tag}}"
    refs = run(["docker", "images", "--filter", f"label=org.nodekit.name={name}", "--format", fmt])[1].split()
    refs += run(["docker", "images", "--format", fmt, f"nodekit/{name}"])[1].split()
    for ref in sorted(set(refs)):
        run(["docker", "rmi", ref])


def phase_clean(state: dict[str, Any]) -> None:
    """The run's images (6 GB each, but for what they share) on both engines, its base, the registries' blobs, the
    projects with their blob stores (every layer above the base: 6 GB) and the base's layer files: gone. The results
    stay in the state. BuildKit's cache of the run's installs stays: it is the engine's, shared with every other
    build, and `docker builder prune` would empty it for everyone."""
    from benchmarks._shipcluster import CONTAINERD_ENGINE, remove_refs

    for name in ("cuda-bench", "bump-bench"):
        remove_images(name)
    remove_refs(state.get("added", {}).get("containerd", []), CONTAINERD_ENGINE)
    state.pop("added", None)
    state.pop("staged", None)
    if isinstance(state.get("base"), str):
        subprocess.run(["docker", "rmi", str(state["base"])], capture_output=True, env=default_engine_env())
        state.pop("base")
    for path in [*WORK.glob("registry*"), WORK / "cuda", WORK / "bump", WORK / "base-layers", WORK / "ssh"]:
        shutil.rmtree(path, ignore_errors=True)
    for log in WORK.glob("tunnel-*.log"):
        log.unlink()


def phase_bump(state: dict[str, object]) -> None:
    """torch 2.14.0 -> 2.14.1 with the layer split: what the upgrade rebuilds and what a push of it sends."""
    check_disk(BUMP_NEED, "the bump phase")
    project = fresh_project("bump", OLD_TORCH, run_base(state))
    old_lock = (project / "nodekit.lock").read_text()
    try:
        before = build(project)
        toml = project / "nodekit.toml"
        toml.write_text(toml.read_text().replace(json.dumps([*OLD_TORCH, "numpy"]), json.dumps([*NEW_TORCH, "numpy"])))
        lock_s, _ = nk(project, "lock")
        from tests import wheelcache

        wheelcache.prefill(project)
        after = build(project)
        new_lock = (project / "nodekit.lock").read_text()
    finally:
        remove_images("bump-bench")
    from nodekit.image.lock import diff_locks, parse_lock

    diff = diff_locks(parse_lock(old_lock), parse_lock(new_lock))
    state["bump"] = {"before": before, "after": after, "lock_s": lock_s, "changed": list(diff.changed),
                     "added": list(diff.added), "removed": list(diff.removed),
                     "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


def phase_build(state: dict[str, object]) -> None:
    """Cold build, size, docker save, no-op, code-only and package-change rebuilds of examples/cuda."""
    check_disk(BUILD_NEED, "the build phase")
    project = fresh_project("cuda", NEW_TORCH, run_base(state))
    v1 = build(project, "--no-cache")
    t0 = time.monotonic()
    subprocess.run(f"docker save {v1['tag']} > /dev/null", shell=True, check=True, env=default_engine_env())
    save_s = round(time.monotonic() - t0, 1)
    noop_s, _ = nk(project, "build")
    train = project / "train.py"
    train.write_text(train.read_text() + "\n# one changed line: a code-only rebuild\n")
    v2 = build(project)
    toml = project / "nodekit.toml"
    toml.write_text(toml.read_text().replace('"numpy"]', f'"numpy", "{EXTRA_PACKAGE}"]'))
    lock_s, _ = nk(project, "lock")
    v3 = build(project)
    state["build"] = {"v1": v1, "v2": v2, "v3": v3, "save_s": save_s, "noop_s": noop_s, "lock_s": lock_s,
                      "project": str(project),
                      "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["all", *PHASES, "render"], default="all")
    parser.add_argument(
        "--stores", default="classic,containerd", help="wire, ship, anchor: image stores (default both)"
    )
    parser.add_argument("--counts", default="1,2,4", help="ship, anchor: target counts (default 1,2,4)")
    parser.add_argument("--mbit", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1,
                        help="ship, anchor: times the package change (c) is measured (default 1; 3 or more decide "
                        "it against the registry on an interval)")  # fmt: skip
    parser.add_argument("--codecs", default="auto,gzip,none", help="wire phase: --compress values (default all)")
    parser.add_argument("--relay-mbit", type=int, default=100,
                        help="relay: the links' rate, where the wire sets the pace (default 100)")  # fmt: skip
    parser.add_argument("--disk-factor", type=float, default=DISK_FACTOR,
                        help="wire, ship, anchor, relay: the free disk asked per target, in images (default 2.2, as "
                        "nodekit's plan; the 4-target runs peaked at 1.9 to 2.0)")  # fmt: skip
    parser.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/")
    opts = parser.parse_args()
    from benchmarks import _cuda_render, _cuda_ship
    from benchmarks._shipnet import parse_stores
    from benchmarks._wirerun import parse_codecs

    try:
        stores, codecs = parse_stores(opts.stores), parse_codecs(opts.codecs)
    except ValueError as e:
        parser.error(str(e))
    _cuda_ship.DISK_FACTOR = opts.disk_factor
    exit_on_signals()
    for var in ("DOCKER_HOST", "DOCKER_CONTEXT"):  # builds and the classic store's pushes: this machine's engine
        os.environ.pop(var, None)
    state: dict[str, Any] = read_state(STATE)
    state["work"] = str(WORK)
    if opts.phase == "all":
        state.pop("base", None)  # a fresh base: this run builds everything it measures
    for phase in PHASES if opts.phase == "all" else [] if opts.phase == "render" else [opts.phase]:
        print(f"cuda bench: phase {phase}", flush=True)
        if phase == "bump":
            phase_bump(state)
        elif phase == "build":
            phase_build(state)
        elif phase == "clean":
            phase_clean(state)
        elif phase == "stage":
            for store in stores:
                _cuda_ship.phase_stage(state, store, save_state)
        elif phase == "wire":
            for store in stores:
                _cuda_ship.phase_wire(state, store, codecs, save_state)
        elif phase == "relay":
            for store in stores:
                for n in sorted({int(c) for c in opts.counts.split(",")} & {1, 4}):
                    _cuda_ship.phase_relay(state, store, n, opts.relay_mbit, save_state)
        elif phase in ("ship", "anchor"):
            run = _cuda_ship.phase_ship if phase == "ship" else _cuda_ship.phase_anchor
            for store in stores:
                for n in sorted({int(c) for c in opts.counts.split(",")}):
                    run(state, store, n, opts.mbit, save_state, max(1, opts.repeats))
        save_state(state)
    section = _cuda_render.render(state)
    print(section)
    if not opts.no_docs:
        _cuda_render.write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
