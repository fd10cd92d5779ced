"""The demo project as the benchmarks use it: examples/ddp copied to a temporary directory (so that edits there
never touch the checkout) and built on this machine's default engine; and their sections of docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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
    return copy_demo_to(Path(tempfile.mkdtemp(prefix=prefix)) / "ddp")


def copy_demo_to(project: Path) -> Path:
    """A fresh copy of examples/ddp at ``project`` (whatever was there is replaced); returns ``project``."""
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    return project


def read_state(path: Path) -> dict[str, object]:
    """A benchmark's accumulated results (a JSON object), or {} before its first phase."""
    doc: dict[str, object] = json.loads(path.read_text()) if path.is_file() else {}
    return doc


def write_state(path: Path, state: dict[str, object]) -> None:
    """``state`` to ``path`` through a temporary file and a rename: a phase killed midway leaves the last one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, path)


def kept(rows: list[dict[str, Any]], new: dict[str, Any], same: tuple[str, ...]) -> list[dict[str, Any]]:
    """``rows`` with ``new`` appended in place of any earlier row that agrees with it on every field of ``same``
    (a phase run again replaces its rows, others stay) (pure)."""
    return [*(r for r in rows if any(r.get(f) != new.get(f) for f in same)), new]


def loadavg() -> str:
    """This machine's load averages over 1, 5 and 15 minutes, as /proc/loadavg gives them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_s() -> tuple[float, float]:
    """CPU seconds this machine has spent since boot (every core, /proc/stat): busy (user, nice, system, irq, softirq
    and steal) and waiting on the disk (iowait). The difference of two readings is what every process used between
    them, the virtual hosts' sshd, dockerd and containers included."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, iowait / tick


def busy_cpu_s() -> float:
    """The busy part of :func:`cpu_s`."""
    return cpu_s()[0]


def now_utc() -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def build(project: Path, *, quiet: bool = False) -> str:
    """`nodekit build --create-base` of ``project`` on the default engine; returns the image reference."""
    sys.path.insert(0, str(ROOT))
    from nodekit.config import settings
    from nodekit.image import builder as nk_build

    cfg = project / "nodekit.toml"
    argv = [sys.executable, "-m", "nodekit", "build", "--create-base", "--config", str(cfg)]
    subprocess.run(argv, check=True, env=default_engine_env(), capture_output=quiet)
    return nk_build.current_image(settings.load(cfg))


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP end the benchmark as Ctrl-C does (SystemExit in the main thread), so that its ``finally``
    blocks run: the virtual cluster comes down, the registry and tunnels stop (`timeout` of the heavy lock sends
    SIGTERM)."""
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
