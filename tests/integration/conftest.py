"""Fixtures for real-Docker tests: the example project, copied to a temporary directory and built once."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import wheelcache
from tests.integration.helpers import EXAMPLE, base_on, nodekit


@pytest.fixture(scope="session")
def ddp_project(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Path:
    """examples/ddp in a temporary directory, with its image built (shared by every test in the session)."""
    dest = tmp_path_factory.mktemp("ddp") / "ddp"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    # The lock and the wheelhouse are inputs, not outputs: reuse the example's cache so the test resolves nothing.
    if (EXAMPLE / ".nodekit" / "wheelhouse").is_dir():
        shutil.copytree(EXAMPLE / ".nodekit" / "wheelhouse", dest / ".nodekit" / "wheelhouse")
    wheelcache.warm(dest)
    built = nodekit("build", "--create-base", config=dest / "nodekit.toml", timeout=1500)
    assert built.returncode == 0, built.stdout + built.stderr
    wheelcache.kept(dest)
    return dest


PROBE_NAME = "nkprobe"
# The probe project's scripts: examples/ddp's image with two small jobs beside train.py.
PROBES = {
    # The id the node was started with (what its preflight compares with the other nodes'), or "-" where none was.
    "ids.py": 'import os\n\nprint("nodekit-image-id", os.environ.get("NODEKIT_IMAGE_ID") or "-", flush=True)\n',
    # Rank 1 raises while rank 0 waits for it in a collective: the cause is on one node, the consequence on the other.
    "boom.py": (
        "import torch.distributed as dist\n\n"
        'dist.init_process_group("gloo")\n'
        "if dist.get_rank() == 1:\n"
        '    raise RuntimeError("boom on rank 1")\n'
        "dist.barrier()\n"
    ),
}


@pytest.fixture(scope="session")
def probe_project(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Callable[[str], Path]:
    """``probe_project(engine)``: examples/ddp named :data:`PROBE_NAME` (its nodes' compose projects are its own, not
    the example's), with :data:`PROBES` beside train.py, built on that engine (once per engine and session). Its tag
    is in ``.nodekit/last-build.json``; `nodekit run` runs it on this machine with ``NODEKIT_HOSTS`` naming that
    engine (:func:`tests.integration.helpers.here_as_hosts`), no SSH."""
    made: dict[str, Path] = {}

    def on(engine: str) -> Path:
        if engine in made:
            return made[engine]
        base_on(engine)
        dest = tmp_path_factory.mktemp("probe") / "probe"
        shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
        for name, text in PROBES.items():
            (dest / name).write_text(text)
        toml = (dest / "nodekit.toml").read_text()
        (dest / "nodekit.toml").write_text(toml.replace('name = "ddp-demo"', f'name = "{PROBE_NAME}"', 1))
        wheelcache.warm(dest)
        built = nodekit("build", config=dest / "nodekit.toml", env={"DOCKER_HOST": engine}, timeout=1500)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        wheelcache.kept(dest)
        made[engine] = dest
        return dest

    return on
