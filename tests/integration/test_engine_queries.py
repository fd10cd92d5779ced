"""nodekit.system.docker's batched image queries against the real engine: the same answers python-on-whales' per-image
calls give, in two engine calls."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.errors import EngineError
from nodekit.system import docker

pytestmark = pytest.mark.docker


def _import(ref: str, *changes: str) -> str:
    """A one-file image made with ``docker import`` (no registry), with Dockerfile ``changes`` (LABEL, ENV)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = ref.encode()
        info = tarfile.TarInfo("etc/ref")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    argv = ["docker", "import", *(a for c in changes for a in ("--change", c)), "-", ref]
    proc = subprocess.run(argv, input=buf.getvalue(), capture_output=True, check=True)
    return proc.stdout.decode().strip()


@pytest.fixture
def labelled() -> Iterator[tuple[str, dict[str, str]]]:
    value = f"q{uuid.uuid4().hex[:10]}"
    refs = {f"nodekit/{value}:a": "1", f"nodekit/{value}:b": "2"}
    made = {}
    for ref, n in refs.items():
        made[ref] = _import(ref, f"LABEL io.nodekit.test={value}", f"LABEL io.nodekit.n={n}", f"ENV NK_N={n}")
    _import(f"nodekit/{value}:other", "LABEL io.nodekit.test=someone-else")
    try:
        yield value, made
    finally:
        for ref in (*refs, f"nodekit/{value}:other"):
            subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, check=False)


def test_images_labelled_finds_exactly_the_labelled_images_with_their_facts(
    labelled: tuple[str, dict[str, str]],
) -> None:
    value, made = labelled
    found = docker.images_labelled("io.nodekit.test", value)
    assert sorted(i.id for i in found) == sorted(made.values())
    for info in found:
        (ref,) = info.tags
        assert made[ref] == info.id
        n = "1" if ref.endswith(":a") else "2"
        assert info.labels["io.nodekit.n"] == n and info.env["NK_N"] == n
        assert info == docker.image_info(info.id)  # what the per-image python-on-whales call says
    assert docker.images_labelled("io.nodekit.test", f"{value}-none") == []


def test_running_a_job_does_not_need_buildx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that only runs pushed images needs the engine and Compose, not Buildx; `nodekit up` and the fleet's
    checks do not ask for it (its call is the slowest of the three). Building does."""
    real = shutil.which("docker")
    assert real is not None
    shim = tmp_path / "bin" / "docker"
    shim.parent.mkdir()
    shim.write_text(
        f'#!/bin/sh\n[ "$1" = buildx ] && {{ echo "unknown command: docker buildx" >&2; exit 1; }}\nexec {real} "$@"\n'
    )
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    info = docker.check_engine(buildx=False)
    assert info.server_version and info.compose_version and info.buildx_version == ""
    with pytest.raises(EngineError, match="Buildx"):
        docker.check_engine()
