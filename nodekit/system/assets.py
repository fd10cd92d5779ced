"""Where the Dockerfile and the compose template are: in a checkout, or inside the installed wheel."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

_PACKAGE = Path(__file__).resolve().parents[1]
"""The ``nodekit`` package directory (this module is ``nodekit/system/assets.py``)."""


def asset_root() -> Path:
    """The directory holding ``images/`` and ``compose/``.

    The wheel carries them under ``nodekit/_assets``; an editable install or a checkout uses the repository's.
    """
    packaged = _PACKAGE / "_assets"
    if (packaged / "images").is_dir():
        return packaged
    return _PACKAGE.parent


def images_dir() -> Path:
    return asset_root() / "images"


@cache
def compose_template() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((asset_root() / "compose" / "template.yaml").read_text())
    return data


def launcher_dir() -> Path:
    """The in-container launcher package, copied into every image."""
    return _PACKAGE / "launcher"
