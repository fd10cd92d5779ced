"""`make demo`: build the example image and run a 2-node DDP job on this machine (main 127.0.0.1).

It runs the same commands a user types on two machines, printing each one, then summarises the job from the
result.json that rank 0 wrote. Exit code 0 only when every node succeeded and all ranks hold equal parameters.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "ddp"
CONFIG = PROJECT / "nodekit.toml"
NODEKIT = [sys.executable, "-m", "nodekit"]
MAIN = "127.0.0.1"


def sh(*args: str, check: bool = True) -> int:
    shown = " ".join(shlex.quote(a) for a in ["nodekit", *args])
    print(f"\n$ {shown}", flush=True)
    code = subprocess.call([*NODEKIT, *args, "--config", str(CONFIG)])
    if check and code != 0:
        print(f"demo: `{shown}` failed with exit code {code}", file=sys.stderr)
        sys.exit(code)
    return code


def node_exit_code(rank: int) -> int:
    from nodekit.backends.compose.node import compose_path, project_for
    from nodekit.config.settings import load
    from nodekit.system import docker

    settings = load(CONFIG)
    return docker.compose_wait(compose_path(settings, rank), project_for(settings, rank))


def main() -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result_file = PROJECT / "outputs" / "result.json"
    sh("build", "--create-base")
    result_file.unlink(missing_ok=True)
    started = time.monotonic()
    # Node 1 in the background, node 0 in the foreground: on two machines these are two terminals.
    sh("up", "--node-rank", "1", "--main", MAIN, "--detach")
    code0 = sh("up", "--node-rank", "0", "--main", MAIN, check=False)
    code1 = node_exit_code(1)
    wall = time.monotonic() - started
    sh("down", "--node-rank", "1")
    sh("down", "--node-rank", "0")
    if code0 != 0 or code1 != 0:
        print(f"demo: FAILED: node 0 exited {code0}, node 1 exited {code1}", file=sys.stderr)
        print("demo: see `nodekit logs --node-rank 1 --config examples/ddp/nodekit.toml`", file=sys.stderr)
        return code0 or code1
    result = json.loads(result_file.read_text())
    checksums = result["checksums"]
    equal = bool(result["checksums_equal"]) and len(set(checksums)) == 1
    print("\n=== nodekit demo summary ===")
    print(f"nodes             {result['nnodes']} (main {MAIN})")
    print(f"processes         {result['world_size']} ({result.get('backend', '?')})")
    print(f"steps             {result['steps']}")
    print(f"final loss        {result['final_loss']:.6f}")
    print(f"param checksums   {'EQUAL on all ranks' if equal else 'DIFFERENT'}: {checksums[0]}")
    print(f"training time     {result['wall_time_s']:.1f} s")
    print(f"wall time         {wall:.1f} s (both nodes, container start to exit)")
    print(f"checkpoint        {PROJECT / 'outputs'}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
