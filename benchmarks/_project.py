"""The demo project as the benchmarks use it: examples/ddp copied to a temporary directory (so that edits there
never touch the checkout) and built on this machine's default engine; and their sections of docs/benchmarks.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp"
DOCS = ROOT / "docs" / "benchmarks.md"


def replace_section(doc: str, title: str, new: str) -> str:
    """``doc`` with the section headed ``title`` (up to the next ``## `` heading) replaced by ``new``, or ``new``
    appended when there is none (pure)."""
    start = doc.find(title)
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + new
    nxt = re.search(r"^## ", doc[start + len(title) :], flags=re.M)
    end = start + len(title) + nxt.start() if nxt else len(doc)
    return doc[:start] + new + ("\n" + doc[end:] if nxt else "")


def default_engine_env() -> dict[str, str]:
    """Our environment without DOCKER_HOST/DOCKER_CONTEXT: builds go to the default engine, whatever the shell
    pointed docker at."""
    return {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}


def copy_demo(prefix: str) -> Path:
    """A fresh copy of examples/ddp (without outputs, compose files, caches) in a new temp dir; returns its path."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    project = work / "ddp"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("outputs", "compose", "__pycache__"))
    return project


def build(project: Path, *, quiet: bool = False) -> str:
    """`nodekit build --create-base` of ``project`` on the default engine; returns the image reference."""
    sys.path.insert(0, str(ROOT))
    from nodekit.config import settings
    from nodekit.image import builder as nk_build

    cfg = project / "nodekit.toml"
    argv = [sys.executable, "-m", "nodekit", "build", "--create-base", "--config", str(cfg)]
    subprocess.run(argv, check=True, env=default_engine_env(), capture_output=quiet)
    return nk_build.current_image(settings.load(cfg))
