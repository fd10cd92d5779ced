"""A real library on the CUDA stack: examples/lightlytrain, LightlyTrain 0.18 pretraining on two
nodes (``lightly_train.pretrain(..., num_nodes=2, devices=1, accelerator="cpu")``, ``launcher = "env"``), each node
with its own copy of a small generated image folder, checked with ``[[mounts]] check = "hashes"`` before training.

lightly-train 0.18 depends (through lightly and hydra-core) on antlr4-python3-runtime 4.9, published only as a
source distribution: the lock builds it into a wheel on the host. The image shares its base, CUDA libraries and
framework layers with examples/cuda's; only its packages layer is its own. Like that image, it is kept in the
engine between runs (a warm run builds nothing), and its wheels come from the cache outside the clone.

Marked big (make test-big, make bench): on a CI machine with nothing cached its build took 247 s (2026-11-27, the
6.8 GB image and its wheels), which took a cold `make test` to 30.5 minutes. The committed lock is held in the unit
tier (tests/unit/image/lock/test_examples.py); the CUDA stack itself stays in make test (test_cuda_stack.py).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.system import docker
from tests import wheelcache
from tests.integration.helpers import ROOT, nodekit

pytestmark = [pytest.mark.docker, pytest.mark.big]

EXAMPLE = ROOT / "examples" / "lightlytrain"
IMAGES = 32


def images(dest: Path) -> Path:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import make_images
    finally:
        sys.path.remove(str(EXAMPLE))
    make_images.make(dest, IMAGES, 64)
    return dest


@pytest.fixture(scope="module")
def lightly_project(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("lightly")
    project = root / "lightlytrain"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    wheelcache.warm(project)
    # Two nodes on one machine, each with its own copy of the data, as two machines would have.
    n0, n1 = images(root / "node0" / "images"), images(root / "node1" / "images")
    toml = project / "nodekit.toml"
    text = toml.read_text().replace('host = "/tmp/nodekit-lightlytrain/images"', f'host = "{n0}"')
    text = text.replace('"--epochs", "2"', '"--epochs", "1"')
    toml.write_text(text + f'\n[nodes.1]\nmounts = {{ "/data" = "{n1}" }}\n')
    built = nodekit("build", "--create-base", config=toml, timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheelcache.kept(project)
    yield project
    keep = json.loads((project / ".nodekit" / "last-build.json").read_text())["tag"]
    for info in docker.images_labelled("org.nodekit.name", "lightlytrain-demo"):
        for tag in info.tags:
            if tag != keep:
                docker.remove_image(tag)
    shutil.rmtree(root, ignore_errors=True)  # the build state and both nodes' data: gigabytes, until the session ends


def test_lightlytrain_pretrains_on_two_nodes_after_the_data_check(lightly_project: Path) -> None:
    config = lightly_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29690"]
    try:
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config)
        assert bg.returncode == 0, bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=900)
        assert fg.returncode == 0, fg.stdout[-4000:] + fg.stderr[-3000:]
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
    out = fg.stdout
    assert "nodekit preflight: ok, 2/2 nodes, identical stacks" in out and "cuda 13.0" in out
    # Both nodes' folders were listed with their contents' sha256 and found the same, before any training.
    assert "nodekit data check: ok" in out, out
    assert f"/data: same paths, sizes and contents on 2 nodes ({IMAGES} files" in out, out
    assert re.search(r"GLOBAL_RANK: 0, MEMBER: 1/2", out), out[-4000:]  # one process group of two, across nodes
    result = json.loads((lightly_project / "outputs" / "result.json").read_text())
    assert result["lightly_train"] == "0.18.0" and result["num_nodes"] == 2 and result["images"] == IMAGES
    assert result["exported_sha256"], result
