"""A stream's compression: chosen for a link (:func:`choose_codec`), or named by a file's suffix
(:func:`codec_for_file`). Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from nodekit.errors import UsageError

Codec = Literal["none", "gzip", "zstd"]
Compress = Literal["auto", "none", "gzip", "zstd"]


ZSTD_LOAD_CRASH = (
    "a zstd stream decompressed by the target's dockerd crashed Docker 26.1.5's daemon in this project's CI (a "
    "nil-pointer panic in its zstd reader, which outlives the pooled buffer it reads), so no engine is ever handed "
    "zstd: an ssh:// node's own zstd command decompresses it before docker load"
)


def choose_codec(compress: Compress, endpoint: str, *, target_zstd: bool = False, here_zstd: bool = False) -> Codec:
    """The stream's compression on the link to ``endpoint``. ``auto``: none over a local unix socket (it would only
    cost CPU); zstd to an ``ssh://`` node when this machine and that node both have the zstd command (multi-threaded
    here, decompressed there: it keeps a 10 GbE link full where gzip's one thread made the head the bottleneck);
    gzip otherwise (the engine decompresses it). An explicit choice is taken as given (:func:`codec_refusal` says
    when it cannot be)."""
    if compress != "auto":
        return compress
    if endpoint.startswith("unix://"):
        return "none"
    if endpoint.startswith("ssh://") and target_zstd and here_zstd:
        return "zstd"
    return "gzip"


def codec_for_file(path: Path) -> Codec:
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz")):
        return "gzip"
    if name.endswith((".tar.zst", ".tzst")):
        return "zstd"
    if name.endswith(".tar"):
        return "none"
    raise UsageError(
        f"{path} should end in .tar, .tar.gz or .tar.zst (that picks the compression)",
        fix=f"nodekit save {path.with_name(path.name + '.tar.zst')}",
    )
