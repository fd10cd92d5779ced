"""`make bench` (part): what a derived image weighs against the base it starts from (issue 11).

A base with torch preinstalled, as NGC's and `pytorch/pytorch`'s images are (made here from nodekit's bookworm base
and the local torch 2.13.0 CPU wheel, its Python environment at /opt/conda first on PATH, the way conda images
are), and a project that adds only `lightning`: nodekit keeps the base's torch (a constraint, not a candidate), so
the image should weigh the base plus the added packages, not a second torch (about 800 MB for this CPU wheel, GBs
for CUDA builds). Not a test (tests/integration/test_base_images.py checks the same with a bound); this measures
and writes its section of docs/benchmarks.md. Needs a Docker engine and `nodekit base` (make base).

    .venv/bin/python benchmarks/base_bench.py [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._project import DOCS, replace_section  # noqa: E402

TITLE = "## A derived image against its base (bring your own base)"


def section(base_mb: float, derived_mb: float, lock_lines: list[str], seconds: float) -> str:
    """The docs section for one measurement (pure)."""
    added = derived_mb - base_mb
    return "\n".join(
        [
            TITLE,
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `benchmarks/base_bench.py`: a base with "
            "torch 2.13.0 (CPU) preinstalled in /opt/conda, and a project whose only package is `lightning==2.6.6`.",
            "",
            "| image | size | |",
            "| --- | --- | --- |",
            f"| base (torch preinstalled) | {base_mb:.1f} MB | |",
            f"| derived (adds lightning) | {derived_mb:.1f} MB | +{added:.1f} MB over the base |",
            "",
            f"The lock keeps the base's torch as `{lock_lines[0] if lock_lines else '(none)'}` and installs "
            f"{len([ln for ln in lock_lines[1:] if ln])} packages of its own; no second torch is installed (a second "
            f"torch would add several hundred MB). The build took {seconds:.1f} s.",
            "",
            "Reproduce: `.venv/bin/python benchmarks/base_bench.py` (needs `make engine base`).",
            "",
        ]
    )


def main() -> int:
    opts = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    opts.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/benchmarks.md")
    args = opts.parse_args()
    from tests.integration.test_base_images import LIGHTNING, TORCH_BASE, _torch_base

    with tempfile.TemporaryDirectory(prefix="nodekit-base-bench-") as tmp:
        work = Path(tmp)
        base = _torch_base(work)
        proj = work / "lit"
        proj.mkdir()
        config = proj / "nodekit.toml"
        config.write_text(
            f'name = "nodekit-bench-derived"\nbase_image = "{TORCH_BASE}"\npackages = ["{LIGHTNING}"]\n'
            'script = "train.py"\nlauncher = "env"\n'
        )
        (proj / "train.py").write_text("import lightning\n")
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "nodekit", "build", "--config", str(config)],
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
        seconds = time.monotonic() - t0
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return 1
        record = json.loads((proj / ".nodekit" / "last-build.json").read_text())
        lock = (proj / "nodekit.lock").read_text().splitlines()
        provided = [ln.strip() for ln in lock if ln.startswith("# provided: torch")]
        own = [ln.split(" ")[0] for ln in lock if ln and not ln.startswith(("#", " "))]
        text = section(base.size / 1e6, record["size"] / 1e6, provided + own, seconds)
        subprocess.run(["docker", "rmi", "-f", str(record.get("tag", ""))], capture_output=True, check=False)
    print(text)
    if not args.no_docs:
        DOCS.write_text(replace_section(DOCS.read_text(), TITLE, text))
        print(f"written to {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
