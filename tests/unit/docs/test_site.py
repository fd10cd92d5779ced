"""The documentation site builds offline and strictly (a broken link or anchor fails it), and a page another
change adds under docs/guides/ or docs/concepts/ is in the navigation without any edit to mkdocs.yml or .pages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=300, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dest = tmp_path / "repo"
    dest.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", dest / "docs")
    return dest


def test_new_guide_and_concept_pages_join_the_navigation_by_themselves(copy: Path, tmp_path: Path) -> None:
    (copy / "docs" / "guides" / "zz-stalls.md").write_text("# Stalled jobs\n\nSee [the fleet](ssh-fleet.md).\n")
    (copy / "docs" / "concepts" / "zz-heartbeats.md").write_text("# Heartbeats\n")
    built = _build(copy, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    for href in ("guides/zz-stalls/", "concepts/zz-heartbeats/", "reference/cli/", "reference/config/",
                 "reference/exit-codes/", "guides/ssh-fleet/", "architecture/", "changelog/"):  # fmt: skip
        assert href in home, f"{href} is not in the navigation"


def test_a_broken_link_fails_the_strict_build(copy: Path, tmp_path: Path) -> None:
    page = copy / "docs" / "guides" / "slurm.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md), [no anchor](ssh-fleet.md#no-such-heading)\n")
    built = _build(copy, tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr and "no-such-heading" in built.stderr
