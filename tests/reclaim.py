"""Before the heavy tiers: give back the disk that earlier runs left behind, so this run starts with room for its peak.

`make test` runs this between the unit tier and the real-engine and cluster tiers (``make reclaim`` runs it alone).
The heavy tiers keep state between runs on purpose: the engines keep the base images and the demo images, the
virtual hosts keep the demo image in their data roots, and ``/var/cache/nodekit-wheels`` keeps the big examples'
wheels and layer blobs (``tests/wheelcache.py``). Left alone, this state grows with every run: each run adds image
tags, build cache and blobs, and a killed run leaves its pytest folders. A full run then fails part-way with "no
space left on device", on whichever test happens to write when the disk fills.

What is always given back (nothing a run needs, or only its own cache over a cap):

- the pytest base folders of earlier sessions that no live process holds (pytest keeps a killed session's);
- the BuildKit cache of each engine above ``KEEP_BUILD_CACHE`` (the engines also collect it themselves,
  ``scripts/engine.sh``), and dangling images;
- the kept layer blobs above ``KEEP_BLOBS_GIB``, least recently used first.

Then, only while the disk has less than the run needs free, in order of what costs a run least to make again: the
older tags of each test image, the data roots of virtual clusters that are not running, the big test images (over
3 GB), and at last every test image but the base images (``make base`` builds those, and no registry can give them
back). The data roots of other clusters (a benchmark's, a test's own) go before those of the cluster tier's groups
(``CLUSTER_NAMES``), which the next run brings up again with the demo image still in them. The run needs
``NEED_GIB`` (the heavy tiers' peak with the big images built and the groups' data roots written again, measured in
docs/development.md), less what it will find kept and need not make: the big test images' bytes of their own in an
engine (``docker system df -v``'s unique size) and the groups' data roots. Removing one to make room gives back its
size and takes the same again when the run makes it, with the minutes that takes. If the disk still lacks the room,
this exits 1 with the numbers, before a test starts.

Only what the tests make is touched: images of the test repositories (``is_test_repo``), the data roots under
``/var/lib/nodekit-cluster``, the pytest folders of this user, and the kept blobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nodekit.runs.store import alive
from tests.cluster.harness import DATA_DIR
from tests.conftest import CLUSTER_NAMES, CONTAINERD_HOST
from tests.wheelcache import CACHE

GIB = 1024**3
NEED_GIB = float(os.environ.get("NODEKIT_TEST_FREE_GIB", "40"))
# The blobs the suite's builds use: about 14 GiB after a run (2026-11-26: the CUDA and LightlyTrain layers, 3.4 GB
# each, and the demo's). Under the 12 GiB cap it had, each run removed 2 GiB of them and built them again (the CUDA
# stack's setup took 115 s against 47). Blobs above the cap go least recently used first.
KEEP_BLOBS_GIB = float(os.environ.get("NODEKIT_KEEP_BLOBS_GIB", "16"))
KEEP_BUILD_CACHE = "6GB"
ENGINES = {"default": os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"), "containerd": CONTAINERD_HOST}
# The repositories the tests and benchmarks build into: the examples' projects (``nodekit/<name>-demo``), the
# integration tests' own (``nodekit/nodekit-itest-*``, ``nodekit-itest/*``) and the sid engine's checks (``nk-sid/*``).
# A developer's own ``nodekit/<project>`` images on the same engine are never touched, nor the bases.
TEST_PREFIXES = ("nodekit-itest/", "nk-sid/", "nodekit/nodekit-itest")


def is_test_repo(repo: str) -> bool:
    return repo.startswith(TEST_PREFIXES) or (repo.startswith("nodekit/") and repo.endswith("-demo"))


BIG_IMAGE = 3 * 10**9


def say(msg: str) -> None:
    print(f"reclaim: {msg}", flush=True)


def free_gib(path: Path = Path("/")) -> float:
    return shutil.disk_usage(path).free / GIB


def _docker(host: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``docker ARGS`` on ``host``; one that has not answered in ``timeout`` seconds is named and counts as failed."""
    env = {**os.environ, "DOCKER_HOST": host}
    try:
        return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        say(f"docker {' '.join(args[:2])} on {host} did not answer within {timeout:g} s; going on without it")
        return subprocess.CompletedProcess(["docker", *args], 124, "", "")


def _answers(host: str) -> bool:
    return _docker(host, "version", "--format", "{{.Server.Version}}", timeout=20).returncode == 0


def stale_pytest_folders(root: Path | None = None) -> list[Path]:
    """This user's pytest base folders (``pytest-N``) whose session is over: no ``.lock``, or a lock whose pid is
    gone. A session that ends removes its lock, and pytest itself removes those folders past its retention count;
    a killed session's lock stays, and pytest keeps its folder for three days."""
    if root is None:
        user = os.environ.get("USER") or "root"
        root = Path(tempfile.gettempdir()) / f"pytest-of-{user}"
    stale = []
    for d in sorted(root.glob("pytest-[0-9]*")) if root.is_dir() else []:
        if d.is_symlink() or not d.is_dir():
            continue
        lock = d / ".lock"
        try:
            pid = int(lock.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0
        if not lock.exists() or pid <= 0 or not alive(pid):
            stale.append(d)
    return stale


def blobs_over_cap(folder: Path, cap_bytes: float) -> list[Path]:
    """The blobs in ``folder`` to remove to bring it under ``cap_bytes``: least recently used first. A blob's use
    is its ctime: nodekit's store touches a blob it reads (utime), and the tests link it into a project's store
    (its link count): both change it."""
    files = []
    for p in folder.iterdir() if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            st = p.stat()
            if p.is_file():
                files.append((st.st_ctime, st.st_size, p))
    total = sum(size for _, size, _ in files)
    over = []
    for _, size, p in sorted(files):
        if total <= cap_bytes:
            break
        over.append(p)
        total -= size
    return over


def _test_images(host: str) -> list[dict[str, str]]:
    out = _docker(host, "image", "ls", "--format", "{{json .}}")
    if out.returncode != 0:
        return []
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [r for r in rows if is_test_repo(r.get("Repository", "")) and r.get("Tag")]


def older_tags(rows: list[dict[str, str]]) -> list[str]:
    """Of each repository's tags, all but ``env`` and the newest other one (``docker image ls`` lists newest
    first)."""
    seen: dict[str, int] = {}
    drop = []
    for r in rows:
        repo, tag = r["Repository"], r["Tag"]
        if tag in ("env", "<none>"):
            continue
        seen[repo] = seen.get(repo, 0) + 1
        if seen[repo] > 1:
            drop.append(f"{repo}:{tag}")
    return drop


def _size_bytes(text: str) -> float:
    units = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            with contextlib.suppress(ValueError):
                return float(text[: -len(unit)]) * units[unit]
    return 0.0


def big_images(rows: list[dict[str, str | float]]) -> dict[str, float]:
    """Of ``docker system df -v``'s images, the test images over 3 GB: each one's bytes no other image holds."""
    big = {}
    for r in rows:
        repo, tag, size = str(r.get("Repository", "")), str(r.get("Tag", "")), str(r.get("Size", "0B"))
        if is_test_repo(repo) and tag not in ("", "<none>") and _size_bytes(size) > BIG_IMAGE:
            big[f"{repo}:{tag}"] = _size_bytes(str(r.get("UniqueSize", "0B")))
    return big


def _big_images(host: str) -> dict[str, float]:
    out = _docker(host, "system", "df", "-v", "--format", "{{json .Images}}", timeout=120)
    try:
        rows = json.loads(out.stdout) if out.returncode == 0 else []
    except ValueError:
        rows = []
    return big_images(rows if isinstance(rows, list) else [])


class Room:
    """The room the heavy tiers need on ``/``: ``NEED_GIB`` less what the run will find kept and need not make again:
    the unique bytes of the big test images (``big``: engine name to image to bytes) and the bytes of the cluster
    groups' data roots (``roots``: root to bytes)."""

    def __init__(
        self,
        big: dict[str, dict[str, float]],
        roots: dict[Path, float] | None = None,
        free: Callable[[], float] = free_gib,
    ) -> None:
        self.big, self.roots, self._free = big, dict(roots or {}), free

    def need_gib(self) -> float:
        kept = sum(sum(images.values()) for images in self.big.values()) + sum(self.roots.values())
        return NEED_GIB - kept / GIB

    def short(self) -> bool:
        return self._free() < self.need_gib()

    def gone(self, engine: str) -> None:
        """``engine``'s big test images were removed: the run builds them again, and needs the room for that."""
        self.big.pop(engine, None)

    def root_gone(self, root: Path) -> None:
        """A group's data root was removed: the run writes it again (the demo image shipped to its hosts)."""
        self.roots.pop(root, None)


def _remove_images(host: str, refs: list[str]) -> int:
    for i in range(0, len(refs), 50):
        _docker(host, "image", "rm", *refs[i : i + 50])
    return len(refs)


def _running_cluster_roots() -> set[Path]:
    """The cluster data roots a live dockerd names on its command line (a cluster another run has up)."""
    live = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            for a in args:
                s = a.decode(errors="replace")
                if s.startswith("--data-root="):
                    s = s.partition("=")[2]
                if s.startswith(str(DATA_DIR) + "/"):
                    live.add(Path(*Path(s).parts[:5]))  # /var/lib/nodekit-cluster/<name>
    return live


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def idle_roots(data_dir: Path = DATA_DIR) -> list[Path]:
    """The clusters' data roots no live dockerd uses (Slurm's image folder is not one)."""
    if not data_dir.is_dir():
        return []
    live = _running_cluster_roots()
    return [r for r in sorted(data_dir.iterdir()) if r.is_dir() and r not in live and r.name != "slurm-images"]


def group_roots(data_dir: Path = DATA_DIR) -> set[Path]:
    """The data roots of the cluster tier's groups, which every run brings up again and finds the demo image in."""
    return {data_dir / name for name in CLUSTER_NAMES.values()}


def removal_order(roots: list[Path], groups: set[Path]) -> list[Path]:
    """Other clusters' data roots first (nothing in the next run finds them), then the groups'."""
    return sorted(roots, key=lambda r: (r in groups, r))


def steps(engines: dict[str, str], room: Room) -> Iterator[str]:
    """What each step did, done one at a time as the caller advances: the first ones always, the rest only while
    ``room.short()`` (the disk lacks the room)."""
    short = room.short
    for d in stale_pytest_folders():
        shutil.rmtree(d, ignore_errors=True)
        yield f"removed {d} (a pytest session that is over)"
    for name, host in engines.items():
        _docker(host, "builder", "prune", "--force", "--keep-storage", KEEP_BUILD_CACHE)
        _docker(host, "image", "prune", "--force")
        yield f"{name} engine: build cache down to {KEEP_BUILD_CACHE}, dangling images removed"
    over = blobs_over_cap(CACHE / "blobs" / "sha256", KEEP_BLOBS_GIB * GIB)
    for p in over:
        p.unlink(missing_ok=True)
    if over:
        yield f"removed {len(over)} kept blobs, least recently used, to keep {KEEP_BLOBS_GIB:g} GiB"
    for name, host in engines.items():
        if not short():
            return
        older = older_tags(_test_images(host))
        for ref in older:  # an older tag of a big image: no longer kept
            room.big.get(name, {}).pop(ref, None)
        yield f"{name} engine: removed {_remove_images(host, older)} older test image tags"
    for root in removal_order(idle_roots(), group_roots()):
        if not short():
            return
        size = room.roots.get(root) or _du(root)  # a group's was measured for the room already
        shutil.rmtree(root, ignore_errors=True)
        room.root_gone(root)
        yield f"removed {root} ({size / GIB:.1f} GiB, the data roots of a cluster that is not up)"
    for name, host in engines.items():
        if not short():
            return
        big = list(room.big.get(name, {}))
        room.gone(name)
        yield f"{name} engine: removed {_remove_images(host, big)} test images over 3 GB (the run builds them again)"
    for name, host in engines.items():
        if not short():
            return
        every = [f"{r['Repository']}:{r['Tag']}" for r in _test_images(host)]
        _remove_images(host, every)
        _docker(host, "builder", "prune", "--all", "--force")
        yield f"{name} engine: removed every test image ({len(every)}) and the build cache"


def main() -> int:
    engines = {name: host for name, host in ENGINES.items() if _answers(host)}
    start = free_gib()
    t0 = time.monotonic()
    groups = group_roots()
    room = Room(
        {name: _big_images(host) for name, host in engines.items()},
        {root: float(_du(root)) for root in idle_roots() if root in groups},
    )
    kept, held = sum(len(images) for images in room.big.values()), NEED_GIB - room.need_gib()
    say(f"{start:.1f} GiB free on /; the heavy tiers want {room.need_gib():.1f} GiB ({NEED_GIB:g}, less the"
        f" {held:.1f} GiB of the {kept} big test images and the {len(room.roots)} group data roots kept, which they"
        " need not make again)")  # fmt: skip
    for what in steps(engines, room):
        say(what)
    end = free_gib()
    say(f"{end:.1f} GiB free ({end - start:+.1f} GiB) in {time.monotonic() - t0:.0f} s")
    if end < room.need_gib():
        print(
            f"reclaim: error: {end:.1f} GiB free on /, and a full run of the heavy tiers needs about"
            f" {room.need_gib():.1f} GiB"
            " (docs/development.md). Fix: free space on / (docker system prune -a on an engine the tests do not"
            " use, or a larger disk), then run make test again",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
