"""A lock that pulls CUDA wheels says so, with what the build will download, before anything is downloaded.

An unpinned ``torch`` on Linux resolves to PyPI's CUDA build: torch plus about twenty ``nvidia-*``/``cuda-*``
packages, near 3 GB of wheels the build then fetches. Locking downloads nothing (pip's dry-run report), so the
warning comes at lock time, with the wheels' sizes asked of the index (a HEAD request per wheel, in parallel, each
bounded; a ``file://`` wheel is looked at on disk). :func:`cuda_packages` and :func:`warning` are pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.utils import canonicalize_name

SIZE_S = 5.0
"""One wheel's size request: an index that does not answer within this leaves the size unknown, never the lock."""
_PARALLEL = 8
_CUDA = re.compile(r"^(nvidia-.+|cuda-.+|triton)$")
CPU_FIX = (
    'for a CPU-only image pin the CPU build: packages = ["torch==2.13.0+cpu"] with extra_index_urls = '
    '["https://download.pytorch.org/whl/cpu"]; for GPUs this is expected'
)


def cuda_packages(names: Iterable[str]) -> list[str]:
    """The packages (canonical names, sorted) that only a CUDA build of torch pulls in."""
    return sorted(n for n in {canonicalize_name(x) for x in names} if _CUDA.match(n))


def wheel_urls(report: Mapping[str, Any]) -> dict[str, str]:
    """Package name -> the URL of the file pip would download, from pip's installation report."""
    out: dict[str, str] = {}
    for item in report.get("install", []):
        url = str(item.get("download_info", {}).get("url", ""))
        if url:
            out[canonicalize_name(item["metadata"]["name"])] = url
    return out


def human(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def warning(cuda: Sequence[str], sizes: Mapping[str, int | None]) -> str | None:
    """The warning for a lock whose packages include ``cuda`` ones (None without any): how many, which, and how
    much the build downloads (``sizes``: every locked wheel's, None where unknown)."""
    if not cuda:
        return None
    known = [s for s in sizes.values() if s is not None]
    cuda_known = [sizes[n] for n in cuda if sizes.get(n) is not None]
    total = sum(known)
    shown = ", ".join(cuda[:3]) + (f" and {len(cuda) - 3} more" if len(cuda) > 3 else "")
    if not known:
        size = "download size unknown (the index did not say)"
    else:
        partial = "at least " if len(known) < len(sizes) else ""
        of_cuda = human(sum(c for c in cuda_known if c is not None))
        size = f"{partial}{human(total)} of wheels for the build to download, {of_cuda} of them CUDA's"
    return f"the lock pulls the CUDA build of torch: {len(cuda)} CUDA packages ({shown}); {size}. {CPU_FIX}"


def _size(url: str) -> int | None:
    """The size of the file at ``url``: on disk for ``file://``, else the index's Content-Length; None when it
    cannot be told within :data:`SIZE_S`."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        try:
            return Path(unquote(parts.path)).stat().st_size
        except OSError:
            return None
    if parts.scheme not in ("http", "https") or "@" in parts.netloc:  # credentials stay out of a request we make
        return None
    import urllib.request

    try:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=SIZE_S) as answer:
            length = answer.headers.get("Content-Length")
            return int(length) if length and length.isdigit() else None
    except (OSError, ValueError):
        return None


def sizes(urls: Mapping[str, str], size_of: Callable[[str], int | None] = _size) -> dict[str, int | None]:
    """Every wheel's size (None where unknown), asked in parallel."""
    if not urls:
        return {}
    names = list(urls)
    with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(names))) as pool:
        return dict(zip(names, pool.map(lambda n: size_of(urls[n]), names), strict=True))


def check(report: Mapping[str, Any], locked: Iterable[str], size_of: Callable[[str], int | None] = _size) -> str | None:
    """The warning for pip's report, counting the ``locked`` packages only (what the base provides is not
    downloaded); None when it pulls no CUDA package. Sizes are asked only then."""
    keep = {canonicalize_name(n) for n in locked}
    urls = {n: u for n, u in wheel_urls(report).items() if n in keep}
    cuda = cuda_packages(urls)
    return warning(cuda, sizes(urls, size_of)) if cuda else None
