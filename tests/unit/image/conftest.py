"""Fixtures of the lock's and the probe's tests: an offline package index, and a host without a Docker engine.

``no_engine`` is not autouse: the modules that resolve ask for it (``pytestmark``), so the image tests that do not
resolve keep the real probe."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.config.settings import Settings
from tests.factories import fake_wheel


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolve as on a host without a Docker engine: nodekit's own base is known without probing it."""
    from nodekit.errors import EngineError
    from nodekit.image import probe

    def absent(settings: Settings, **_: object) -> probe.BaseStack:
        raise EngineError("no Docker engine in unit tests")

    monkeypatch.setattr(probe, "probe_base", absent)


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline find-links directory standing in for the user's package index."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    fake_wheel(links, "alpha", "1.0", ("beta>=1",))
    fake_wheel(links, "beta", "1.0")
    fake_wheel(links, "gamma", "1.0")
    fake_wheel(links, "gamma", "2.0")
    return links
