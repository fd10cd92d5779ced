"""The top-level ``compose/`` directory: the demo's (examples/ddp) two node files exactly as nodekit renders them for
two machines, main at 10.0.0.5 and a worker at 10.0.0.6 (no GPUs, the project at /home/me/ddp-demo on each), so a
reader sees what ``nodekit up`` writes and can run it by hand with ``docker compose up``.

``python -m tests.compose_examples compose`` (``make docs``) writes them again;
tests/unit/backends/compose/test_top_level_compose.py fails when the committed files differ from what the code
renders now. The world is fixed here (facts, image, secret, paths), never read from this machine.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from nodekit.backends.compose.node import plan
from nodekit.config.settings import Settings
from nodekit.job.gather import world_of
from nodekit.system.host.facts import HostFacts

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "ddp" / "nodekit.toml"
PROJECT = Path("/home/me/ddp-demo")
MAIN, WORKER = "10.0.0.5", "10.0.0.6"
IMAGE = "nodekit/ddp-demo:0123456789ab"  # `nodekit build` prints the real one: nodekit/ddp-demo:<fingerprint>
SECRET = "REPLACE-with-one-secret-for-every-node"  # nodekit writes the project's own (.nodekit/job-secret)


def demo_settings() -> Settings:
    """examples/ddp's nodekit.toml as if the project lived at :data:`PROJECT`; NODEKIT_* variables are ignored."""
    saved = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith("NODEKIT_")]}
    try:
        return Settings(project_dir=PROJECT, **tomllib.loads(DEMO.read_text(encoding="utf-8")))
    finally:
        os.environ.update(saved)


def files() -> dict[str, str]:
    """``node-<rank>.yaml`` -> its text, for both nodes of the demo."""
    settings = demo_settings()
    out = {}
    for rank, addr in ((0, MAIN), (1, WORKER)):
        facts = HostFacts(gpu_count=0, iface="eth0", local_addr=addr)
        world = world_of(settings, rank, MAIN, facts, image=IMAGE, cwd=PROJECT, job_secret=SECRET)
        node = plan(settings, world).detail
        out[node.compose_path.name] = node.text
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    where = Path(args[0] if args else ROOT / "compose")
    where.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (where / name).write_text(text, encoding="utf-8")
        print(f"wrote {where / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
