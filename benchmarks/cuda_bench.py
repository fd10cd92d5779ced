"""`make bench` (part): the CUDA image (examples/cuda: PyPI's CUDA torch 2.14.1 and torchvision, about 6 GB)
built, changed and shipped, beside the demo image's figures (benchmarks/ship_bench.py). Issue 21, items 2 and 3.

Phases, each short enough for one hold of the machine's heavy lock; results accumulate in <work>/state.json and the
docs section is written from it (``--phase render``, also after every phase):

- ``bump``: the layer split. A project at torch 2.14.0 / torchvision 0.29.0, then upgraded to 2.14.1 / 0.29.1: time
  of each build, which layers changed and their sizes, and whether the CUDA libraries' pins moved. It builds on a
  base of its own (nodekit/base:bookworm plus a label: the same files, another image id), so BuildKit's cache of
  other builds cannot answer for it.
- ``build``: cold build (``--no-cache``, wheelhouse filled), image size and layers, ``docker save`` time, no-op
  rebuild, a code-only change (one line of train.py) and a package change (``six`` added): their rebuild times.
- ``ship --counts N``: the virtual cluster's head sends the three versions (a: whole image to empty nodes, b: the
  code change, c: the package change) to N targets over real SSH, relayed, links limited to 1 Gbit/s; and the
  registry anchor (docker push once per version, pulls on every target through SSH tunnels). The head's source
  engine is this machine's (no 6 GB copy into the head's engine); the targets' data roots are purged afterwards.

    nk-heavy .venv/bin/python benchmarks/cuda_bench.py --phase all        # or one phase at a time
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._project import default_engine_env  # noqa: E402

WORK = Path(os.environ.get("NODEKIT_CUDA_BENCH_DIR", "/var/tmp/nodekit-cuda-bench"))
STATE = WORK / "state.json"
EXAMPLE = ROOT / "examples" / "cuda"
BUMP_BASE = "nodekit-bench/base-bump:1"
OLD_TORCH = ("torch==2.14.0", "torchvision==0.29.0")
NEW_TORCH = ("torch==2.14.1", "torchvision==0.29.1")
EXTRA_PACKAGE = "six==1.17.0"


def load_state() -> dict[str, object]:
    return json.loads(STATE.read_text()) if STATE.is_file() else {}


def save_state(state: dict[str, object]) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    tmp = STATE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, STATE)


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
    """The image's layers, base first: diff id, size (docker history), and which step made it."""
    out = run(["docker", "history", "--no-trunc", "--human=false", "--format", "{{.CreatedBy}}\t{{.Size}}", ref])[1]
    steps = [ln.rsplit("\t", 1) for ln in reversed(out.strip().splitlines())]
    made = [(by, int(size)) for by, size in steps if int(size) > 0]
    inspect = json.loads(run(["docker", "image", "inspect", ref])[1])[0]
    diff_ids = inspect["RootFS"]["Layers"]
    if len(made) != len(diff_ids):
        made = [("?", 0)] * len(diff_ids)
    return [{"diff_id": d, "size": size, "step": step_name(by)} for d, (by, size) in zip(diff_ids, made, strict=True)]


def step_name(created_by: str) -> str:
    """Which layer a history entry (or a BuildKit log line) is: the package steps name their lock files."""
    for key, name in (("cudalibs", "CUDA libraries"), ("framework", "framework"), ("packages", "packages")):
        if f"/wheels/{key}.lock" in created_by or f"from={key}," in created_by:
            return name
    if "from=wheels," in created_by:
        return "packages"
    if "COPY nodekit" in created_by:
        return "launcher"
    if "written by nodekit build" in created_by or "COPY . /workspace" in created_by:
        return "code"
    return "base"


def step_seconds(log: str) -> dict[str, float]:
    """BuildKit's own time per package layer (``#N DONE 123.4s`` after the step's ``RUN --mount=...from=X``)."""
    heads = dict(re.findall(r"#(\d+) \[[^\]]*\] RUN --mount=type=bind,from=(\w+)", log))
    done = dict(re.findall(r"#(\d+) DONE ([\d.]+)s", log))
    return {step_name(f"from={ctx},"): float(done[n]) for n, ctx in heads.items() if n in done}


def fresh_project(name: str, packages: tuple[str, ...], base: str | None = None) -> Path:
    from tests import wheelcache

    project = WORK / name
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    toml = project / "nodekit.toml"
    text = toml.read_text()
    text = re.sub(r"^name = .*$", f'name = "{name}-bench"', text, flags=re.M)
    text = re.sub(r"^packages = .*$", "packages = " + json.dumps([*packages, "numpy"]), text, flags=re.M)
    if base:
        text += f'base_image = "{base}"\n'
    toml.write_text(text)
    if packages != NEW_TORCH or base:
        (project / "nodekit.lock").unlink()
        nk(project, "lock")
    wheelcache.prefill(project)
    return project


def build(project: Path, *flags: str) -> dict[str, object]:
    from tests import wheelcache

    seconds, log = nk(project, "build", "--create-base", *flags)
    wheelcache.keep(project)
    tag = tag_of(project)
    return {"tag": tag, "seconds": seconds, "size": image_size(tag), "layers": layers(tag),
            "steps": step_seconds(log)}  # fmt: skip


def remove_images(name: str) -> None:
    fmt = "{{.Repository}}:{{.Tag}}"
    for ref in run(["docker", "images", "--filter", f"label=org.nodekit.name={name}", "--format", fmt])[1].split():
        run(["docker", "rmi", ref])


def phase_bump(state: dict[str, object]) -> None:
    """torch 2.14.0 -> 2.14.1 with the layer split: what the upgrade rebuilds and what a push of it sends."""
    proc = subprocess.run(["docker", "build", "-q", "-t", BUMP_BASE, "-"], input="FROM nodekit/base:bookworm\n"
                          "LABEL org.nodekit.bench=torch-upgrade\n", text=True, capture_output=True,
                          env=default_engine_env(), timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    project = fresh_project("bump", OLD_TORCH, base=BUMP_BASE)
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
        run(["docker", "rmi", BUMP_BASE])
    from nodekit.lock import diff_locks, parse_lock

    diff = diff_locks(parse_lock(old_lock), parse_lock(new_lock))
    state["bump"] = {"before": before, "after": after, "lock_s": lock_s, "changed": list(diff.changed),
                     "added": list(diff.added), "removed": list(diff.removed),
                     "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


def phase_build(state: dict[str, object]) -> None:
    """Cold build, size, docker save, no-op, code-only and package-change rebuilds of examples/cuda."""
    project = fresh_project("cuda", NEW_TORCH)
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
    parser.add_argument("--phase", choices=["all", "bump", "build", "ship", "render"], default="all")
    parser.add_argument("--counts", default="1,2,4", help="ship phase: target counts (default 1,2,4)")
    parser.add_argument("--mbit", type=int, default=1000)
    parser.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/")
    opts = parser.parse_args()
    from benchmarks import _cuda_render, _cuda_ship

    state = load_state()
    state["work"] = str(WORK)
    phases = ["bump", "build", "ship"] if opts.phase == "all" else [opts.phase]
    for phase in phases:
        print(f"cuda bench: phase {phase}", flush=True)
        if phase == "bump":
            phase_bump(state)
        elif phase == "build":
            phase_build(state)
        elif phase == "ship":
            for n in (int(c) for c in opts.counts.split(",")):
                _cuda_ship.phase_ship(state, n, opts.mbit, save_state)
            if opts.phase == "all":
                shutil.rmtree(WORK / "registry", ignore_errors=True)  # gigabytes of blobs, pushed once per run
        save_state(state)
    section = _cuda_render.render(state)
    print(section)
    if not opts.no_docs:
        _cuda_render.write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
