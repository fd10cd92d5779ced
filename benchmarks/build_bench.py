"""Build benchmark: cold build, no-op rebuild, code-only rebuild, and image size against what it holds.

    .venv/bin/python benchmarks/build_bench.py [--project examples/ddp] [--repeat 5] [--json out.json]

Works on a scratch copy of the project (its code is edited), under another image name, so the project's own
images and files are untouched. "cold" is a --no-cache build: every layer is rebuilt, but the wheelhouse is
already filled (downloading is the lock's job, not the build's). Targets (issue 2): no-op < 2 s, code-only
< 10 s, image <= 1.10 x (base + /opt/venv). Prints a table, then the numbers as JSON; ``run()`` returns them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nodekit.config.settings import Settings, load
from nodekit.image import builder as building
from nodekit.image import lock as locking
from nodekit.system import docker
from nodekit.system.progress import NullReporter

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"noop_s": 2.0, "code_change_s": 10.0, "size_ratio": 1.10}


def _scratch_copy(project: Path, dest: Path) -> Path:
    """The project without its build outputs; the wheelhouse is hard-linked so nothing is fetched again."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        return {n for n in names if n in (".nodekit", "outputs", "__pycache__") or n.startswith("node-")}

    shutil.copytree(project, dest, ignore=ignore, symlinks=True)
    house = project / ".nodekit" / "wheelhouse"
    if house.is_dir():
        shutil.copytree(house, dest / ".nodekit" / "wheelhouse", copy_function=os.link)
    return dest


def _synthetic(dest: Path) -> Path:
    dest.mkdir(parents=True)
    (dest / "nodekit.toml").write_text('script = "train.py"\npackages = ["torch==2.13.0"]\n')
    (dest / "train.py").write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    return dest


def _timed(settings: Settings, **kw: Any) -> building.BuildResult:
    return building.build(settings, NullReporter(), **kw)


def _script(settings: Settings) -> Path:
    if settings.script:
        return settings.project_dir / settings.script
    return next(p for p in sorted(settings.project_dir.rglob("*.py")) if ".nodekit" not in p.parts)


def run(project: Path | None = None, *, repeat: int = 5, cold: bool = True) -> dict[str, Any]:
    """Measure on a scratch copy of ``project`` (default: examples/ddp, else a one-file torch project)."""
    with tempfile.TemporaryDirectory(prefix="nodekit-bench-") as tmp:
        src = project or (REPO / "examples" / "ddp")
        root = _scratch_copy(src, Path(tmp) / "p") if (src / "nodekit.toml").is_file() else _synthetic(Path(tmp) / "p")
        settings = load(root / "nodekit.toml", name="nodekit-bench")
        tags: set[str] = set()
        # Lock and fill the wheelhouse first: resolving and downloading are not what "cold build" measures.
        lock, _ = locking.ensure_lock(settings, NullReporter())
        locking.ensure_wheelhouse(settings, lock, NullReporter())
        try:
            first = _timed(settings, no_cache=cold)
            tags.add(first.tag)
            cold_s = first.seconds if cold else None

            noop = [_timed(settings).seconds for _ in range(repeat)]

            script = _script(settings)
            original = script.read_text()
            change, shared = [], True
            for i in range(max(1, repeat // 2)):
                script.write_text(original + f"\n# benchmark edit {i} {time.time()}\n")
                before = building.layers(first.tag)
                r = _timed(settings)
                tags.add(r.tag)
                change.append(r.seconds)
                after = building.layers(r.tag)
                shared = shared and before[:-1] == after[:-1] and before[-1] != after[-1]
            script.write_text(original)

            image = docker.require_image(first.tag)
            base = docker.require_image(settings.base_image)
            venv = int(docker.run_in_image(first.tag, ["-sb", "/opt/venv"], entrypoint="du").split()[0])
            return {
                "project": str(src),
                "image": first.tag,
                "packages": first.plan.packages,
                "cold_build_s": cold_s,
                "noop_s": statistics.median(noop),
                "noop_runs_s": noop,
                "code_change_s": statistics.median(change),
                "code_change_runs_s": change,
                "code_change_shares_lower_layers": shared,
                "image_bytes": image.size,
                "base_bytes": base.size,
                "base_image": settings.base_image,
                "added_bytes": image.size - base.size,  # what the image adds over its base (issue 11)
                "venv_bytes": venv,
                "size_ratio": round(image.size / (base.size + venv), 4),
                "targets": TARGETS,
            }
        finally:
            for tag in tags:
                docker.remove_image(tag)


def table(r: dict[str, Any]) -> str:
    def mark(key: str) -> str:
        return "ok" if r[key] <= TARGETS[key] else "MISSED"

    mb = 1e6
    cold = f"{r['cold_build_s']:.1f} s" if r["cold_build_s"] is not None else "-"
    rows = [
        ("cold build (--no-cache, wheelhouse filled)", cold, ""),
        ("no-op rebuild (median)", f"{r['noop_s']:.2f} s", f"< {TARGETS['noop_s']:.0f} s {mark('noop_s')}"),
        (
            "code-only rebuild (median)",
            f"{r['code_change_s']:.2f} s",
            f"< {TARGETS['code_change_s']:.0f} s {mark('code_change_s')}",
        ),
        ("code-only rebuild shares lower layers", str(r["code_change_shares_lower_layers"]), ""),
        ("image", f"{r['image_bytes'] / mb:.1f} MB", ""),
        ("base + /opt/venv", f"{r['base_bytes'] / mb:.1f} + {r['venv_bytes'] / mb:.1f} MB", ""),
        (
            f"image over its base ({r.get('base_image', 'base')})",
            f"+{r['image_bytes'] / mb - r['base_bytes'] / mb:.1f} MB",
            f"{r['image_bytes'] / r['base_bytes']:.2f} x the base",
        ),
        ("image / (base + venv)", f"{r['size_ratio']:.3f}", f"<= {TARGETS['size_ratio']} {mark('size_ratio')}"),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    return "\n".join(f"{a.ljust(w0)}  {b.rjust(w1)}  {c}".rstrip() for a, b, c in rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--project", type=Path, default=None, help="project with a nodekit.toml (default examples/ddp)")
    p.add_argument("--repeat", type=int, default=5, help="no-op rebuilds to time (code-only: half as many)")
    p.add_argument("--no-cold", action="store_true", help="skip the --no-cache build")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    result = run(args.project, repeat=args.repeat, cold=not args.no_cold)
    print(table(result))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    r = main()
    sys.exit(0 if all(r[k] <= v for k, v in TARGETS.items()) else 1)
