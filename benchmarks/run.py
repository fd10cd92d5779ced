"""`make bench`: nodekit against bare torchrun on the same 2-node job, plus build times and image size.

Not a test: it measures and writes docs/benchmarks.md. Both sides run the example's train.py with the same
arguments as two nodes on this machine (main 127.0.0.1), alternating, ``--reps`` times each; medians compared.
Targets (issue 2): nodekit wall time <= 1.15 x bare torchrun; no-op rebuild < 2 s; code-only rebuild < 10 s;
image <= 1.10 x (base + installed packages).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp"
BENCH_VENV = ROOT / ".nodekit" / "bench-venv"
PORT = 29710


def bare_venv() -> Path:
    """A host virtual environment with the same torch the image pins."""
    py = BENCH_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "torch==2.13.0"], check=True)
    return py


def run_bare(py: Path, train_args: list[str], workdir: Path) -> float:
    """Two torchrun processes (node 0 and 1) on 127.0.0.1; seconds until both exited."""
    torchrun = py.parent / "torchrun"
    env = os.environ | {"NODEKIT_OUTPUT_DIR": str(workdir / "bare-outputs"), "GLOO_SOCKET_IFNAME": "lo"}
    start = time.monotonic()

    def torchrun_argv(rank: int) -> list[str]:
        rdzv = ["--master-addr", "127.0.0.1", "--master-port", str(PORT)]
        return [str(torchrun), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1", *rdzv]

    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen([*torchrun_argv(r), "train.py", *train_args], cwd=EXAMPLE, env=env, **quiet) for r in (0, 1)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    elapsed = time.monotonic() - start
    if any(codes):
        raise SystemExit(f"bare torchrun failed: exit codes {codes}")
    return elapsed


def nodekit(*args: str, config: Path) -> None:
    subprocess.run([sys.executable, "-m", "nodekit", *args, "--config", str(config)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def run_nodekit(config: Path, train_args: list[str]) -> float:
    """`nodekit up -d` on node 1 and node 0, then wait for both containers; seconds until both exited."""
    from nodekit import docker
    from nodekit.node import compose_path, project_for
    from nodekit.settings import load

    settings = load(config)
    flags = ["--main", "127.0.0.1", "--master-port", str(PORT), "--detach"]
    start = time.monotonic()
    for rank in (1, 0):
        nodekit("up", "--node-rank", str(rank), *flags, config=config)
    codes = [docker.compose_wait(compose_path(settings, r), project_for(settings, r)) for r in (0, 1)]
    elapsed = time.monotonic() - start
    for rank in (0, 1):
        nodekit("down", "--node-rank", str(rank), config=config)
    if any(codes):
        raise SystemExit(f"nodekit run failed: exit codes {codes}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--train-args", default="--epochs 30", help="arguments for examples/ddp/train.py")
    parser.add_argument("--skip-build", action="store_true", help="skip the build benchmark")
    opts = parser.parse_args()
    train_args = opts.train_args.split()
    work = ROOT / ".nodekit" / "bench"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    build: dict[str, float] = {}
    if not opts.skip_build:
        sys.path.insert(0, str(ROOT))
        from benchmarks.build_bench import run as build_run

        build = build_run()

    config = EXAMPLE / "nodekit.toml"
    subprocess.run([sys.executable, "-m", "nodekit", "build", "--config", str(config)], check=True)
    py = bare_venv()
    bare, kit = [], []
    for _ in range(opts.reps):
        bare.append(run_bare(py, train_args, work))
        kit.append(run_nodekit(config, train_args))
    bare_med, kit_med = statistics.median(bare), statistics.median(kit)
    ratio = kit_med / bare_med
    results = {
        "train_args": opts.train_args,
        "reps": opts.reps,
        "bare_torchrun_s": bare,
        "nodekit_s": kit,
        "bare_median_s": bare_med,
        "nodekit_median_s": kit_med,
        "ratio": ratio,
        "build": build,
    }
    print(json.dumps(results, indent=2))
    print(f"\n2-node job: bare torchrun {bare_med:.2f} s, nodekit {kit_med:.2f} s, ratio {ratio:.3f} "
          f"({'within' if ratio <= 1.15 else 'ABOVE'} the 1.15 target)")  # fmt: skip
    (ROOT / ".nodekit" / "bench.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
