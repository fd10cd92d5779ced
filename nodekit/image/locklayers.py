"""Pure: which of the lock's pins go to which of the image's three package layers (CUDA libraries, framework,
packages), and the per-layer requirement files."""

from __future__ import annotations

import re
from typing import NamedTuple

# The lock's pins go to three layers, by what changes least, lowest first (each installed from its own build
# context, so BuildKit's cache key for a layer depends on its wheels alone):
#
# - the CUDA libraries layer: the nvidia-* and cuda-* wheels PyPI's CUDA torch depends on (cuBLAS, cuDNN, NCCL,
#   ...: about 2.2 GB of its 2.9 GB of wheels, 4 GB installed), and setuptools. They move with the CUDA version,
#   not with every torch release: torch 2.14.0 -> 2.14.1 pins the same 16 nvidia-*/cuda-* wheels, byte for byte
#   (docs/benchmarks.md, "The CUDA image"), so a torch upgrade rebuilds and ships the layer above only. setuptools
#   is here because ensurepip puts its own copy into the environment in this step: replacing it in the same step
#   keeps the old copy out of the image (a later layer would only hide it under a whiteout).
# - the framework layer: torch and its companions, released together with it (torchvision, torchaudio, triton).
# - the packages layer: everything else the lock pins; adding or upgrading a package rebuilds and ships that layer
#   (and the small ones above it) alone.
CUDA_LIBS_PACKAGE = re.compile(r"^(nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+|setuptools)==")
FRAMEWORK_PACKAGE = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton(-[a-z0-9]+)*)==")


class LockLayers(NamedTuple):
    """The lock's requirement lines split between the image's three package layers (see CUDA_LIBS_PACKAGE), each a
    valid ``--require-hashes`` requirement file on its own."""

    cuda_libs: str
    framework: str
    packages: str


def split_lock(lock_text: str) -> LockLayers:
    """Pure: the lock split between the CUDA libraries, framework and packages layers.

    The two lower files carry only the ``# python:`` and ``# platform:`` lines of the lock's header: the header's
    ``# input:`` lines (the project's requirements) change whenever a package is added, and a lower layer's file
    must not, or BuildKit would rebuild that layer (minutes, for CUDA) when only the packages layer changed. The
    packages file keeps the whole header.
    """
    header = [ln for ln in lock_text.splitlines() if not ln or ln.startswith("#")]
    lines = [ln for ln in lock_text.splitlines() if ln and not ln.startswith("#")]
    target = [ln for ln in header if ln.startswith(("# python:", "# platform:"))]
    cuda = [ln for ln in lines if CUDA_LIBS_PACKAGE.match(ln)]
    framework = [ln for ln in lines if FRAMEWORK_PACKAGE.match(ln)]
    packages = [ln for ln in lines if not CUDA_LIBS_PACKAGE.match(ln) and not FRAMEWORK_PACKAGE.match(ln)]

    def text(head: list[str], body: list[str]) -> str:
        return "\n".join(head).rstrip("\n") + "\n" + "".join(f"{ln}\n" for ln in body)

    return LockLayers(
        cuda_libs=text(["# nodekit: the CUDA libraries layer's pins, from nodekit.lock", *target], cuda),
        framework=text(["# nodekit: the framework layer's pins, from nodekit.lock", *target], framework),
        packages=text(header, packages),
    )
