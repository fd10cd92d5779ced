"""What one node's stack is: gathered inside the container, published to main during preflight.

:class:`StackReport` is plain data (JSON in the store). :func:`gather` is the only function that imports torch, and it
does so lazily so the rest of the launcher is importable without it.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import nodekit
from nodekit.launcher.config import LaunchConfig
from nodekit.launcher.contract import Env


@dataclass(frozen=True)
class StackReport:
    """One node's stack and launch parameters. Empty strings mean "not applicable or unknown" (no CUDA, no GPU)."""

    rank: int
    hostname: str
    address: str
    fingerprint: str
    image_id: str
    python: str
    torch: str
    cuda: str
    cudnn: str
    nccl: str
    driver: str
    gpu_model: str
    gpu_count: int
    nodekit: str
    nnodes: int
    nproc_per_node: int
    world_size: str
    master_port: int
    mode: str
    name: str

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> StackReport:
        """Tolerant of fields added by a newer launcher (ignored) and removed ones (empty): a version skew must
        reach the comparison and be reported there, not crash the parser."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            default: Any = 0 if f.type in ("int", int) else ""
            kwargs[f.name] = data.get(f.name, default)
        return cls(**kwargs)


def _run(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def parse_nvidia_smi(out: str) -> tuple[str, int, str]:
    """(model, count, driver) from ``nvidia-smi --query-gpu=name,driver_version --format=csv,noheader``.

    Mixed models or drivers on one node are joined with " + " so that they show up in the comparison.
    """
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    if not rows:
        return "", 0, ""
    models = sorted({r[0] for r in rows})
    drivers = sorted({r[1] for r in rows if len(r) > 1})
    return " + ".join(models), len(rows), " + ".join(drivers)


def parse_proc_driver(first_line: str) -> str:
    """The driver version from the first line of /proc/driver/nvidia/version, e.g.
    ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024``."""
    for token in first_line.split():
        if token[:1].isdigit() and "." in token:
            return token
    return ""


def _gpus_from_nvidia_smi() -> tuple[str, int, str]:
    # nvidia-smi sees the GPUs the container was given without creating a CUDA context, which would take
    # seconds and GPU memory in a process that is about to start the workers.
    return parse_nvidia_smi(_run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]))


def _driver_from_proc() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            return parse_proc_driver(f.readline())
    except OSError:
        return ""


def _gpus_from_proc(dev: str = "/dev", proc: str = "/proc/driver/nvidia/gpus") -> tuple[str, int]:
    """(model, count) without CUDA: the container's /dev/nvidiaN files, models from the driver's /proc entries
    (which list the host's GPUs, so a model is reported only when they all agree). ("", 0) when unknown."""
    try:
        count = sum(1 for name in os.listdir(dev) if name.startswith("nvidia") and name[6:].isdigit())
    except OSError:
        return "", 0
    models: set[str] = set()
    try:
        for bus in os.listdir(proc):
            with open(os.path.join(proc, bus, "information")) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "Model":
                        models.add(value.strip())
    except OSError:
        models = set()
    return (models.pop() if count and len(models) == 1 else ""), count


def gather(cfg: LaunchConfig, address: str, env: Mapping[str, str] | None = None) -> StackReport:
    """This node's facts. ``address`` is the local address this node reaches main from (main's own for node 0)."""
    import torch  # type: ignore[import-not-found, unused-ignore]  # lazy: only preflight needs it

    env = os.environ if env is None else env
    cuda = torch.version.cuda or ""
    cudnn = ""
    nccl = ""
    if cuda:
        try:
            v = torch.backends.cudnn.version()
            cudnn = str(v) if v else ""
        except Exception:  # a CUDA wheel without usable cuDNN libraries still reports the rest
            cudnn = ""
        try:
            nv = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in nv) if isinstance(nv, tuple) else str(nv)
        except Exception:
            nccl = ""
    model, count, driver = _gpus_from_nvidia_smi()
    if not driver:
        driver = _driver_from_proc()
    if count == 0 and cuda:
        # No nvidia-smi: never ask torch.cuda, which initialises CUDA in this process and holds memory on GPU 0
        # for the whole job. The device files and the driver's /proc entries say as much without a context.
        model, count = _gpus_from_proc()
    return StackReport(
        rank=cfg.node_rank,
        hostname=socket.gethostname(),
        address=address,
        fingerprint=cfg.fingerprint,
        image_id=cfg.image_id or env.get(Env.IMAGE_ID, ""),
        python=platform.python_version(),
        torch=str(torch.__version__),
        cuda=cuda,
        cudnn=cudnn,
        nccl=nccl,
        driver=driver,
        gpu_model=model,
        gpu_count=count,
        nodekit=nodekit.__version__,
        nnodes=cfg.nnodes,
        nproc_per_node=cfg.nproc_per_node,
        world_size=str(cfg.world_size) if cfg.world_size is not None else "",
        master_port=cfg.master_port,
        mode=cfg.mode,
        name=cfg.name,
    )
