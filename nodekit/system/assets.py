"""Where the Dockerfile is: in a checkout, or inside the installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
"""The ``nodekit`` package directory (this module is ``nodekit/system/assets.py``)."""


def asset_root() -> Path:
    """The directory holding ``images/``.

    The wheel carries them under ``nodekit/_assets``; an editable install or a checkout uses the repository's.
    """
    packaged = _PACKAGE / "_assets"
    if (packaged / "images").is_dir():
        return packaged
    return _PACKAGE.parent


def images_dir() -> Path:
    return asset_root() / "images"


def launcher_dir() -> Path:
    """The in-container launcher package, copied into every image."""
    return _PACKAGE / "launcher"
