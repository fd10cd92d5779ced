"""A code change of a real project reaches a node from the build's blob store alone: no ``docker save``.

``nodekit build`` writes the image's last layer (the code) and its config itself (nodekit/image/append.py) and keeps
them in the project's blob store; ``nodekit push`` to a node that has the rest of the image sends just those.
Every docker command nodekit runs goes through a logging wrapper in front of the real client, so the test sees
that no ``docker save`` ran. A damaged store costs a slower push through ``docker save``, never a wrong image.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.cluster.helpers import Demo, nodekit_argv
from tests.conftest import logging_docker

pytestmark = [pytest.mark.cluster, pytest.mark.docker]


def saves(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln for ln in lines if " image save " in f" {ln} "]


@pytest.mark.smoke
def test_a_code_change_travels_from_the_blob_store_without_docker_save(
    demo_on_main: Demo, cluster: Cluster, tmp_path: Path
) -> None:
    h0 = cluster.main
    assert h0.image_id(demo_on_main.ref) == demo_on_main.image_id  # the node has the environment
    project = tmp_path / "ddp"
    shutil.copytree(demo_on_main.project, project, ignore=shutil.ignore_patterns("outputs", "compose"))
    marker = f"# changed by the test {uuid.uuid4().hex}"
    with (project / "train.py").open("a") as f:
        f.write(marker + "\n")
    env, log = logging_docker(tmp_path)
    cfg = ("--config", str(project / "nodekit.toml"))

    def nodekit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(nodekit_argv(*args, *cfg), capture_output=True, text=True, env=env, cwd=project,
                              timeout=600)  # fmt: skip

    built = nodekit("build")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "writing the launcher layer and the code layer" in built.stderr, built.stderr
    new = next(line.split()[1] for line in built.stdout.splitlines() if line.startswith("built:"))
    try:
        want = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", new], capture_output=True,
                              text=True, env=env).stdout.strip()  # fmt: skip
        assert want.startswith("sha256:") and want != demo_on_main.image_id, (new, want)
        log.unlink(missing_ok=True)

        pushed = nodekit("push", new, "--to", f"h0={h0.docker_host}")
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        assert "from the build's blob store" in pushed.stderr and "1 of " in pushed.stderr, pushed.stderr
        assert saves(log) == [], log.read_text()
        assert h0.image_id(new) == want
        shown = h0.docker("run", "--rm", "--network", "none", "--entrypoint", "tail", new, "-n1",
                          "/workspace/train.py")  # fmt: skip
        assert shown.stdout.strip() == marker

        # A damaged store: the blob is refused on its digest, and the push goes through docker save instead.
        h0.docker("rmi", new)
        layers = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", new],
                                capture_output=True, text=True, env=env).stdout  # fmt: skip
        code_layer = project / ".nodekit" / "blobs" / "sha256" / json.loads(layers)[-1].removeprefix("sha256:")
        code_layer.write_bytes(code_layer.read_bytes()[:-1] + b"\x01")
        again = nodekit("push", new, "--to", f"h0={h0.docker_host}")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "from the build's blob store" not in again.stderr and saves(log), again.stderr
        assert not code_layer.exists()
        assert h0.image_id(new) == want
    finally:
        h0.docker("rmi", new, check=False)
        subprocess.run(["docker", "rmi", new], capture_output=True, env=env)
