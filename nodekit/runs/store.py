"""Where run records live: ``<project>/.nodekit/runs/<id>/`` on the machine that started the run, one directory per
run (``run.json``, ``log.txt``: the merged log, ``samples.jsonl``: what ``nodekit top`` sampled during it).

Ids sort by time (``20261124-153012-3f2a``: UTC, then 4 random hex digits); a command names one by any unique
prefix, or ``last``. The directory is the user's alone (0700): logs say what the job printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nodekit.errors import UsageError
from nodekit.runs.model import NotARecord, RunRecord
from nodekit.system.files import NotReadable, read_bounded, write_atomic
from nodekit.system.proc import alive as alive  # `nodekit runs` asks store.alive of each record's writer

RUNS = Path(".nodekit") / "runs"
RECORD = "run.json"
LOG = "log.txt"
SAMPLES = "samples.jsonl"


def runs_dir(project_dir: Path) -> Path:
    return project_dir / RUNS


def new_id(now: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


def make_dir(root: Path, run_id: str) -> Path:
    """The new run's directory (and the runs directory, 0700, when it is the first)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    d = root / run_id
    d.mkdir(mode=0o700)
    return d


def save(d: Path, record: RunRecord) -> None:
    write_atomic(d / RECORD, json.dumps(record.to_dict(), indent=1) + "\n", mode=0o600)


def load(d: Path) -> RunRecord:
    """The record in ``d``; UsageError naming the file when it is not one (a corrupt or crafted file: a cloned
    repo can carry .nodekit/runs/)."""
    path = d / RECORD
    try:
        return RunRecord.from_json(_read(path))
    except (NotARecord, NotReadable) as e:
        raise UsageError(
            f"{path} is not a nodekit run record ({_why(e)})",
            fix=f"remove {d} unless you want to look into it (a copied project can carry records); nodekit runs lists "
            "the others",
        ) from None


def records(root: Path, bad: Callable[[Path, str], None] = lambda path, why: None) -> Iterator[tuple[Path, RunRecord]]:
    """Every readable record, newest first. A directory without run.json (one being made) is passed over; a
    run.json that cannot be read or is not a record is left out and told to ``bad(path, why)``."""
    if not root.is_dir():
        return
    for d in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True):
        path = d / RECORD
        try:
            record = RunRecord.from_json(_read(path))
        except FileNotFoundError:
            continue
        except OSError as e:
            bad(path, e.strerror or str(e))
            continue
        except (NotARecord, NotReadable) as e:
            bad(path, _why(e))
            continue
        yield d, record


RECORD_CAP = 16 << 20  # a record is KiBs (the settings, 20 lines of log); the cap is for a planted /dev/zero
SAMPLES_CAP = 1 << 30  # a day of nodekit top on 8 nodes every 2 s is about 70 MiB


def _read(path: Path) -> bytes:
    return read_bounded(path, RECORD_CAP)


def _why(e: ValueError) -> str:
    return f"it {e}" if isinstance(e, NotReadable) else str(e)


def find(root: Path, wanted: str) -> Path:
    """The directory of the run ``wanted`` names (an id, a unique prefix of one, or ``last``); UsageError else."""
    # lexists: a run.json that is a link to no file is named by load, not passed over as "no run".
    found = (p.name for p in root.iterdir() if os.path.lexists(p / RECORD)) if root.is_dir() else iter(())
    names = sorted(found, reverse=True)
    if not names:
        raise UsageError(f"no run records in {root}", fix="nodekit run (or up, or slurm --submit) records one")
    if wanted == "last":
        return root / names[0]
    matches = [n for n in names if n.startswith(wanted)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise UsageError(f"{what} with id {wanted!r} in {root}", fix="nodekit runs lists them; give more of the id")
    return root / matches[0]


def prune(root: Path, keep: int, *, spare: str = "") -> list[str]:
    """Remove the oldest records beyond ``keep`` (a running one and ``spare`` are never removed); their ids."""
    gone = []
    found = list(records(root))
    for d, record in found[keep:]:
        if d.name == spare or (record.ended is None and not record.detached and alive(record.pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d.name)
    return gone


def live(root: Path) -> Path | None:
    """The newest record of a run still going on here (its process alive), if any."""
    for d, record in records(root):
        if record.ended is None and not record.detached and alive(record.pid):
            return d
    return None


def append_samples(d: Path, samples: list[dict[str, Any]]) -> None:
    """Add ``nodekit top``'s samples to a run's record (one JSON object a line; one write per call)."""
    if not samples:
        return
    text = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in samples)
    fd = os.open(d / SAMPLES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with contextlib.closing(os.fdopen(fd, "a")) as f:
        f.write(text)


def read_samples(d: Path) -> list[dict[str, Any]]:
    """The samples of a run (a torn last line, from a top stopped mid-write, is passed over); UsageError naming the
    file when it is not a regular file (a planted link to /dev/zero would be read forever)."""
    path = d / SAMPLES
    try:
        text = read_bounded(path, SAMPLES_CAP).decode(errors="replace")
    except FileNotFoundError:
        return []
    except NotReadable as e:
        raise UsageError(f"{path} {e}", fix=f"remove {path}: nodekit top writes it while a run goes on") from None
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                found.append(item)
    return found
