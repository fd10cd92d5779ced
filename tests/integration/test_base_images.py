"""Bring your own base on the real engine, with bases made here (no registry).

- ``nodekit base`` never tags Debian under another image's name (``nvidia/cuda:...`` missing: refused).
- Bases that cannot work are refused with one line: no Python at all (an image ``FROM scratch`` with one file),
  or a shell but no Python (the bookworm base with its python3 removed).
- A base with torch preinstalled the way conda images have it (a Python environment at /opt/conda, first on PATH):
  a project adding only ``lightning`` gets an image without a second torch (size checked against the base) and
  a two-node Lightning job runs with the base's torch.
- A trixie base (Python 3.13): probed as such, a project locks and builds for it with PyPI's cp313 CUDA torch, and a
  two-node job runs on it.

The bases made here are kept between sessions (tagged ``nodekit-itest/...``) since they are pure functions of
their inputs; a fresh machine makes them (about a minute each).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nodekit.system import docker
from tests import wheelcache
from tests.integration.helpers import ROOT, nodekit

pytestmark = pytest.mark.docker

TORCH_BASE = "nodekit-itest/conda-torch:2.13.0"
NO_PYTHON = "nodekit-itest/no-python:1"
NO_SHELL = "nodekit-itest/scratch:1"
LIGHTNING = "lightning==2.6.6"

LIGHTNING_TRAIN = """\
import json, os, sys
import torch
import torch.distributed as dist
import lightning as L


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
trainer = L.Trainer(
    accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_epochs=1, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
if trainer.global_rank == 0:
    out = os.environ.get("NODEKIT_OUTPUT_DIR", "/outputs")
    with open(os.path.join(out, "lightning.json"), "w") as f:
        json.dump({"world_size": trainer.world_size, "steps": trainer.global_step, "torch": torch.__file__,
                   "lightning": L.__file__, "version": torch.__version__}, f)
dist.barrier()
sys.stdout.flush()
os._exit(0)  # torch 2.13's gloo teardown can abort a rank at exit (see examples/ddp/train.py)
"""


def _docker(*args: str, timeout: int = 600, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, input=stdin)


def _build_image(tag: str, dockerfile: str, context: Path) -> None:
    (context / "Dockerfile").write_text(dockerfile)
    done = _docker("build", "--network", "none", "-q", "-t", tag, str(context))
    assert done.returncode == 0, done.stderr[-2000:]


def _project(root: Path, body: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "nodekit.toml").write_text(body)
    return root / "nodekit.toml"


def _one_line_refusal(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    text = result.stderr.strip()
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


# --- nodekit base names only its own image ------------------------------------------------------------------


def test_nodekit_base_refuses_a_missing_vendor_image_and_tags_nothing(tmp_path: Path) -> None:
    vendor = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    assert docker.image_info(vendor) is None
    config = _project(tmp_path, f'name = "vendor"\nscript = "t.py"\nbase_image = "{vendor}"\n')
    (tmp_path / "t.py").write_text("")
    for args in (("base",), ("build", "--create-base")):
        text = _one_line_refusal(nodekit(*args, config=config), vendor, "nodekit base makes only nodekit/base:")
        assert f"docker load {vendor}" in text
        assert docker.image_info(vendor) is None


# --- bases that cannot work ---------------------------------------------------------------------------------


def test_bases_without_python_are_refused_with_one_line(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello").write_text("not a program\n")
    _build_image(NO_SHELL, "FROM scratch\nCOPY hello /hello\n", ctx)
    _build_image(
        NO_PYTHON,
        "FROM nodekit/base:bookworm\nRUN rm -f /usr/bin/python3* /usr/bin/python && ! command -v python3\n",
        ctx,
    )
    for image, what in ((NO_SHELL, "has no /bin/sh"), (NO_PYTHON, "has no Python")):
        proj = tmp_path / image.split("/")[1].split(":")[0]
        config = _project(proj, f'name = "nopy"\nscript = "t.py"\nbase_image = "{image}"\npackages = ["six"]\n')
        (proj / "t.py").write_text("")
        _one_line_refusal(nodekit("build", config=config), image, what)
        assert not (proj / "nodekit.lock").exists()


# --- a base with torch: keep it, add only what the project adds ---------------------------------------------


def _torch_base(tmp_path: Path) -> docker.ImageInfo:
    """bookworm + torch 2.13.0 (the local CPU wheel) in a Python environment at /opt/conda, first on PATH."""
    have = docker.image_info(TORCH_BASE)
    if have is not None:
        return have
    ctx = tmp_path / "torchctx"
    (ctx / "wheels").mkdir(parents=True)
    got = subprocess.run(
        ["python", "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(ctx / "wheels"), "torch==2.13.0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    _build_image(
        TORCH_BASE,
        "FROM nodekit/base:bookworm\n"
        "RUN --mount=type=bind,source=wheels,target=/w python3 -m venv /opt/conda \\\n"
        " && /opt/conda/bin/pip install -q --no-index --no-cache-dir --find-links /w torch==2.13.0\n"
        "ENV PATH=/opt/conda/bin:$PATH\n",
        ctx,
    )
    return docker.require_image(TORCH_BASE)


@pytest.mark.big  # 111 s on a cleaned machine (the torch base built first), 64 warm: make test-big, make bench
def test_a_base_with_torch_keeps_it_and_a_two_node_lightning_job_runs(tmp_path: Path) -> None:
    base = _torch_base(tmp_path)
    proj = tmp_path / "lit"
    config = _project(
        proj,
        f'name = "nodekit-itest-lightning"\nbase_image = "{TORCH_BASE}"\npackages = ["{LIGHTNING}"]\n'
        'script = "train.py"\nlauncher = "env"\nnnodes = 2\nnproc_per_node = 1\n',
    )
    (proj / "train.py").write_text(LIGHTNING_TRAIN)

    # A requirement the base contradicts is refused before anything resolves, naming both.
    clash = _project(tmp_path / "clash", f'name = "clash"\nbase_image = "{TORCH_BASE}"\npackages = ["torch==2.12.0"]\n')
    _one_line_refusal(nodekit("lock", config=clash), "torch==2.12.0", "the base image has torch 2.13.0")

    built = nodekit("build", config=config, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    lock = (proj / "nodekit.lock").read_text()
    assert "\ntorch==" not in lock and "# provided: torch==2.13.0+cpu" in lock
    assert "\nlightning==2.6.6 " in lock
    record = json.loads((proj / ".nodekit" / "last-build.json").read_text())
    added = record["size"] - base.size
    print(f"derived image {record['size'] / 1e6:.1f} MB = base {base.size / 1e6:.1f} MB + {added / 1e6:.1f} MB")
    # lightning and its dependencies are tens of MB; a second torch would be several hundred.
    assert 0 < added < 200e6, f"derived {record['size'] / 1e6:.0f} MB vs base {base.size / 1e6:.0f} MB"

    inspected = nodekit("inspect", "--json", config=config)
    assert inspected.returncode == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["torch"].startswith("2.13.0") and report["python"].startswith("3.11")
    assert "torch==2.13.0+cpu" in report["from_base"]

    flags = ["--main", "127.0.0.1", "--master-port", "29660"]
    try:
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config)
        assert bg.returncode == 0, bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=400)
        assert fg.returncode == 0, fg.stdout[-3000:] + fg.stderr[-3000:]
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
        for info in docker.images_labelled("org.nodekit.name", "nodekit-itest-lightning"):
            for tag in info.tags:
                docker.remove_image(tag)
    result = json.loads((proj / "outputs" / "lightning.json").read_text())
    assert result["world_size"] == 2 and result["steps"] > 0
    assert result["torch"].startswith("/opt/conda/"), result  # the base's torch ran
    assert result["lightning"].startswith("/opt/venv/"), result  # what the project added


# --- a second real Python: trixie, with the cp313 CUDA torch from PyPI -------------------------------------------

# PyPI's torch-2.14.1-cp313-cp313-manylinux_2_28_x86_64.whl: the CUDA build, the only torch 2.14.1 for CPython 3.13
TORCH_CP313_SHA256 = "c8f71aabc67bcbfc9373dc131537a5968d04edce73e88add21354a7cd0a76985"


@pytest.mark.big  # 3.6 minutes and about 9 GB (image, blobs) when the engine lacks it: make test-big, make bench
def test_a_trixie_base_runs_a_two_node_job_with_the_cp313_cuda_torch(tmp_path: Path) -> None:
    """CPython 3.13 (Debian trixie's), probed as such; the lock resolves for 3.13 with markers evaluated for it, and
    the CUDA build of torch (the cp313 wheels come from PyPI: about 0.8 GB beyond the cp311 stack's nvidia-* wheels,
    which are the same files, kept in the wheel cache outside the clone) trains a 2-node DDP job on the CPU.

    The image is kept in the engine between runs, as the base is (a pure function of this test's files)."""
    made = nodekit("base", "--suite", "trixie", "--if-missing", config=_project(tmp_path / "b", ""), timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    proj = tmp_path / "trixie"
    config = _project(
        proj,
        'name = "nodekit-itest-trixie"\nbase_image = "nodekit/base:trixie"\nscript = "train.py"\n'
        'args = ["--epochs", "2"]\nnnodes = 2\nnproc_per_node = 1\n'
        # numpy: torch 2.14's broadcast_object_list (train.py's resume) needs it
        'packages = ["torch==2.14.1", "numpy", "six==1.17.0", "exceptiongroup==1.3.1; python_version < \'3.12\'"]\n',
    )
    shutil.copy(ROOT / "examples" / "ddp" / "train.py", proj / "train.py")
    (proj / "t.py").write_text("import sys, six\nprint('python', sys.version.split()[0], 'six', six.__version__)\n")
    locked = nodekit("lock", config=config, timeout=900)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    lock = (proj / "nodekit.lock").read_text()
    assert "# python: 3.13\n" in lock and "# platform: manylinux_2_41_x86_64\n" in lock
    # the marker holds for the host's 3.11, not for the image's 3.13
    assert "\nsix==1.17.0 " in lock and "\nexceptiongroup==" not in lock
    assert f"\ntorch==2.14.1 --hash=sha256:{TORCH_CP313_SHA256}" in lock and "\nnvidia-nccl-cu13==" in lock
    wheelcache.warm(proj)
    built = nodekit("build", config=config, timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheelcache.kept(proj)
    tag = json.loads((proj / ".nodekit" / "last-build.json").read_text())["tag"]
    try:
        ran = _docker("run", "--rm", "--network", "none", "--entrypoint", "python", tag, "/workspace/t.py")
        assert ran.returncode == 0 and ran.stdout.startswith("python 3.13.") and "six 1.17.0" in ran.stdout, ran
        probe_files = list((proj / ".nodekit" / "base-probe").glob("*.json"))
        assert len(probe_files) == 1
        assert json.loads(probe_files[0].read_text())["stack"]["version"].startswith("3.13.")
        report = json.loads(nodekit("inspect", "--json", config=config).stdout)
        assert report["python"].startswith("3.13.") and report["torch"] == "2.14.1+cu130" and report["cuda"] == "13.0"

        flags = ["--main", "127.0.0.1", "--master-port", "29680"]
        try:
            bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config)
            assert bg.returncode == 0, bg.stderr
            fg = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=600)
            if fg.returncode != 0:
                other = nodekit("logs", "--node-rank", "1", config=config).stdout
                pytest.fail(f"node 0: {fg.stdout[-3000:]}{fg.stderr[-2000:]}\nnode 1: {other[-3000:]}")
        finally:
            for rank in (0, 1):
                nodekit("down", "--node-rank", str(rank), config=config)
        assert re.search(r"identical stacks \(image \w+, torch 2\.14\.1\+cu130, cuda 13\.0, python 3\.13\.", fg.stdout)
        result = json.loads((proj / "outputs" / "result.json").read_text())
        assert result["world_size"] == 2 and result["backend"] == "gloo" and result["checksums_equal"] is True
    finally:
        # Only this image is kept (6 GB): earlier fingerprints of the test's project are removed.
        for info in docker.images_labelled("org.nodekit.name", "nodekit-itest-trixie"):
            for t in info.tags:
                if t != tag:
                    docker.remove_image(t)
        shutil.rmtree(proj, ignore_errors=True)
