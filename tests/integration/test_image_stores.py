"""Both of Docker's image stores, on real engines: the default engine (the classic store) and the engine with the
containerd image store that `make test` starts beside it (`make engine-containerd`; Engine 29's default store on
fresh installs). The same project builds to the same image on both, runs a 2-node job on the containerd store, and
a code change there moves one small layer."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from nodekit.backends.slurm.render import IDENTITY_FORMAT
from nodekit.system import docker
from tests.integration.helpers import base_on, example_copy, nodekit

pytestmark = pytest.mark.docker


def record(project: Path) -> dict[str, str]:
    doc: dict[str, str] = json.loads((project / ".nodekit" / "last-build.json").read_text())
    return doc


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, containerd_engine: str) -> tuple[Path, Path, str]:
    """The example built on each engine, each from its own copy (so each engine's BuildKit made the layers)."""
    ctd = {"DOCKER_HOST": containerd_engine}
    base_on(containerd_engine)
    on_classic = example_copy(tmp_path_factory.mktemp("classic") / "ddp")
    on_ctd = example_copy(tmp_path_factory.mktemp("containerd") / "ddp")
    built = nodekit("build", config=on_ctd / "nodekit.toml", env=ctd, timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    built = nodekit("build", config=on_classic / "nodekit.toml", timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return on_classic, on_ctd, containerd_engine


def test_the_same_project_is_the_same_image_on_both_stores(both: tuple[Path, Path, str]) -> None:
    on_classic, on_ctd, host = both
    a, b = record(on_classic), record(on_ctd)
    # Each engine's BuildKit installed the packages; nodekit wrote the layers: the same bytes, the same image.
    assert a["fingerprint"] == b["fingerprint"] and a["tag"] == b["tag"]
    assert a["config_digest"] == b["config_digest"] and a["manifest_digest"] == b["manifest_digest"]
    # Each store names it its own way: the classic store by the config digest, the containerd store by the manifest.
    classic, ctd = docker.require_image(a["tag"]), docker.require_image(b["tag"], host)
    assert classic.id == a["config_digest"] and ctd.id == b["manifest_digest"]
    assert classic.identity == ctd.identity and classic.layers == ctd.layers
    # A Slurm task (docker mode) hashes its own engine's inspect through one template: the same on both stores.
    argv = ["image", "inspect", "--format", IDENTITY_FORMAT, a["tag"]]
    engines = ("unix:///var/run/docker.sock", host)
    seen = {
        subprocess.run(["docker", "-H", h, *argv], capture_output=True, text=True, check=True).stdout for h in engines
    }
    assert len(seen) == 1 and a["tag"] and '"sha256:' in seen.pop()
    # The containerd store holds every blob the manifest names: the image is complete there (listed, savable).
    listed = subprocess.run(["docker", "-H", host, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert b["tag"] in listed


def test_two_nodes_train_on_the_containerd_store(both: tuple[Path, Path, str]) -> None:
    _, on_ctd, host = both
    config, env = on_ctd / "nodekit.toml", {"DOCKER_HOST": host}
    flags = ["--main", "127.0.0.1", "--master-port", "29690"]
    try:
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config, env=env)
        assert bg.returncode == 0, bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config, env=env, timeout=600)
        assert fg.returncode == 0, fg.stdout[-3000:] + fg.stderr[-3000:]
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config, env=env)
    assert "nodekit preflight: ok, 2/2 nodes, identical stacks" in fg.stdout
    result = json.loads((on_ctd / "outputs" / "result.json").read_text())
    assert result["world_size"] == 2 and result["checksums_equal"] is True


def test_a_code_change_on_the_containerd_store_loads_one_small_layer(both: tuple[Path, Path, str]) -> None:
    _, on_ctd, host = both
    train = on_ctd / "train.py"
    text = train.read_text()
    line = f"# a one-line change {uuid.uuid4().hex}"  # new every run: an image left by an earlier run is not reused
    train.write_text(text + line + "\n")
    try:
        built = nodekit("build", "--verbose", config=on_ctd / "nodekit.toml", env={"DOCKER_HOST": host})
        assert built.returncode == 0, built.stdout + built.stderr
        out = built.stdout + built.stderr
        # Only the code layer was new to the engine; no package layer was built again.
        assert "loading 1 of 6 layers" in out, out
        assert "RUN --mount" not in out, out
        tag = record(on_ctd)["tag"]
        shown = subprocess.run(["docker", "-H", host, "run", "--rm", "--network", "none", "--entrypoint", "tail",
                                tag, "-n1", "/workspace/train.py"], capture_output=True, text=True)  # fmt: skip
        assert shown.stdout.strip() == line
    finally:
        train.write_text(text)
