"""What ``nodekit init`` writes: the commented starter ``nodekit.toml`` (its packages taken from the project's
``requirements.txt`` and ``pyproject.toml`` when present) and a ``.dockerignore`` that keeps data, outputs and
virtual environments out of the image. Pure: the caller reads the files and writes the results."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from nodekit.config.settings import DEFAULT_TORCH
from nodekit.launcher.contract import LAUNCH_MODES

DOCKERIGNORE = """\
# What stays out of the image (written by nodekit init; Docker's .dockerignore rules). Only the code goes in:
# data, outputs and environments stay on the host (mount data with [[mounts]] in nodekit.toml), and so does the
# configuration: launch settings travel in each node's compose file, the packages (nodekit.lock) in a layer of
# their own.
outputs/
compose/
.nodekit/
nodekit.toml
nodekit.lock
requirements.txt
# data and checkpoints
data/
datasets/
checkpoints/
wandb/
mlruns/
lightning_logs/
**/*.ckpt
**/*.pt
**/*.pth
**/*.safetensors
# virtual environments and caches
.venv/
venv/
env/
.env/
.conda/
**/__pycache__/
**/*.pyc
.pytest_cache/
.mypy_cache/
.ruff_cache/
**/.ipynb_checkpoints/
# version control and editors
.git/
.hg/
.idea/
.vscode/
"""


@dataclass(frozen=True)
class Packages:
    """The image's packages as ``nodekit init`` found them, and what it should tell the user about them."""

    packages: tuple[str, ...]
    found_in: tuple[str, ...] = ()  # "requirements.txt", "pyproject.toml"
    warnings: tuple[str, ...] = ()


def _requirements_txt(text: str) -> tuple[list[str], list[str]]:
    """Requirement lines of a requirements file, and the lines nodekit cannot take (options, includes, paths)."""
    found, skipped = [], []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            found.append(str(Requirement(line)))
        except InvalidRequirement:
            skipped.append(line)
    return found, skipped


def _pyproject(text: str) -> list[str]:
    try:
        deps = tomllib.loads(text).get("project", {}).get("dependencies", [])
    except tomllib.TOMLDecodeError:
        return []
    return [str(d) for d in deps if isinstance(d, str)]


def _pinned(req: Requirement) -> bool:
    return any(s.operator in ("==", "===") and "*" not in s.version for s in req.specifier)


def project_packages(requirements_txt: str | None, pyproject_toml: str | None) -> Packages:
    """The image's packages from the project's ``requirements.txt`` and ``pyproject.toml`` ``[project]
    dependencies`` (either may be None: absent), in that order, each name once; ``torch`` added pinned when neither
    names it (the launcher needs it). Warns on an unpinned torch (it resolves to the newest CUDA build, about 3 GB)
    and on lines nodekit cannot take."""
    packages: list[str] = []
    found_in: list[str] = []
    warnings: list[str] = []
    sources: list[tuple[str, list[str]]] = []
    if requirements_txt is not None:
        reqs, skipped = _requirements_txt(requirements_txt)
        sources.append(("requirements.txt", reqs))
        if skipped:
            more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
            warnings.append(
                f"requirements.txt: left out {skipped[0]!r}{more}: nodekit.toml takes requirements only "
                "(package indexes: index_url, extra_index_urls, find_links)"
            )
    if pyproject_toml is not None:
        sources.append(("pyproject.toml", _pyproject(pyproject_toml)))
    seen: set[str] = set()
    for where, reqs in sources:
        if reqs:
            found_in.append(where)
        for r in reqs:
            name = canonicalize_name(Requirement(r).name)
            if name not in seen:
                seen.add(name)
                packages.append(r)
    torch = next((Requirement(p) for p in packages if canonicalize_name(Requirement(p).name) == "torch"), None)
    if torch is None:
        packages.insert(0, DEFAULT_TORCH)
    elif not _pinned(torch):
        warnings.append(
            f"torch is not pinned ({str(torch)!r}): the lock takes the newest release, on Linux the CUDA build "
            f"(about 3 GB of wheels). Pin it in nodekit.toml: {DEFAULT_TORCH!r}, or the CPU build "
            f"'{DEFAULT_TORCH}+cpu' with extra_index_urls = [\"https://download.pytorch.org/whl/cpu\"]"
        )
    return Packages(tuple(packages), tuple(found_in), tuple(warnings))


def _toml_list(items: Sequence[str]) -> str:
    if sum(len(i) + 4 for i in items) < 90:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"
    return "[\n" + "".join(f"  {json.dumps(i)},\n" for i in items) + "]"


def _styles() -> str:
    return ", ".join(f'"{m}"' for m in LAUNCH_MODES)


def starter_config(
    name: str, script: str = "train.py", packages: Sequence[str] = (DEFAULT_TORCH,), found_in: Sequence[str] = ()
) -> str:
    origin = f" (from {' and '.join(found_in)})" if found_in else ""
    return f'''# nodekit.toml: one file describes the image and the job; every node uses the same file.
# Precedence: command-line flags > NODEKIT_* environment variables > this file > defaults.
# Example: NODEKIT_NNODES=4 overrides nnodes below; --nnodes 4 overrides both.

# ---- the image --------------------------------------------------------------------------------------------
# Tagged nodekit/<name>:<fingerprint>; the fingerprint changes whenever the base, the lock, the Dockerfile,
# nodekit's launcher or your code changes, so every node can prove it runs the same stack.
name = "{name}"
# Base image. On a real cluster pin it by digest (e.g. "nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:...").
# nodekit/base:bookworm (Debian + Python) needs no registry: `nodekit build` makes it here when it is missing.
base_image = "nodekit/base:bookworm"
# Python packages for the image{origin}, resolved on this host into nodekit.lock (hash-locked) by
# `nodekit lock`. CUDA, cuDNN and NCCL come with the CUDA builds of the torch wheel; pin torch either way.
packages = {_toml_list(packages)}

# ---- the job ----------------------------------------------------------------------------------------------
# The training script, relative to this directory (or: module = "mypkg.train").
script = "{script}"
args = []
# How each node starts the script, one of {_styles()}
# (docs/guides/launch-styles.md says which fits the guide your script follows).
launcher = "torchrun"
# For `nodekit up` by hand. With hosts = [...] below, leave it out: the hosts count the nodes.
nnodes = 2
# An integer, or "auto": the node's GPU count (1 on a CPU-only node).
nproc_per_node = "auto"
# Rendezvous port on the main node; nodekit also uses the next port (master_port + 1) for its preflight.
master_port = 29500
# Seconds every node waits for the others before giving up and naming who is missing.
rdzv_timeout = 180
# Restarts of the whole worker group by torchrun after a failure (0: fail fast).
max_restarts = 0
# Seconds without a node's heartbeat before the other nodes stop and name it (0: no watchdog).
peer_timeout = 15
# Seconds in which no rank issues a collective and no rank's main thread moves: nodekit then prints every rank's
# stack grouped by where it waits and stops the job (exit 22), or only prints with stall_action = "warn" (0: never).
stall_timeout = 300
# stall_action = "stop"
# Host directory mounted at /outputs in the job (checkpoints, results).
output_dir = "outputs"
# Host networking (default) is what lets NCCL and gloo reach other machines; "bridge" only for all-local runs.
# network = "host"
# InfiniBand: "auto" passes /dev/infiniband when present (else NCCL_IB_DISABLE=1); "on" requires it; "off".
# ib = "auto"

# The nodes, for `nodekit run` on a head node (rank = position; each reached over SSH, nothing installed there):
# hosts = ["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"]
# main = "10.0.0.5"        # main's address as the other nodes reach it (default: host 0's)

# Data from the hosts, mounted read-only into every node's job (writable = true to write; check = "sizes" or
# "hashes" proves every node has the same files before training starts):
# [[mounts]]
# host = "data"              # relative: this project's data/ (kept out of the image); or absolute: /data/imagenet
# container = "/data"
# check = "sizes"

# Extra environment variables for the job.
[env]
# NCCL_DEBUG = "WARN"

# Per-node overrides, when detection is not what you want:
# [nodes.1]
# iface = "ens5"
'''
