"""A lock that pulls CUDA wheels says so, with the size the build will download, before anything is downloaded
(issue 32: an unpinned torch became 19 nvidia-*/cuda-* packages, about 2.9 GB, without a word)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from nodekit.config.settings import Settings
from nodekit.image import lock as locking
from nodekit.image.lock import cuda
from nodekit.image.probe import WheelTarget
from nodekit.system.progress import RecordingReporter


def _report(urls: dict[str, str]) -> dict[str, Any]:
    return {
        "install": [{"metadata": {"name": n, "version": "1"}, "download_info": {"url": u}} for n, u in urls.items()]
    }


def test_cuda_packages_are_named_with_their_download_size(tmp_path: Path) -> None:
    files = {"torch": 800_000_000, "nvidia-cublas-cu12": 1_500_000_000, "nvidia_cudnn_cu12": 600_000_000,
             "triton": 150_000_000, "cuda-bindings": 10_000_000, "numpy": 20_000_000}  # fmt: skip
    urls = {}
    for name, size in files.items():
        path = tmp_path / f"{name}.whl"
        with path.open("wb") as f:
            f.truncate(size)  # sparse: the size is what counts
        urls[name] = path.as_uri()
    said = cuda.check(_report(urls), files)
    assert said is not None
    assert said.startswith(
        "the lock pulls the CUDA build of torch: 4 CUDA packages (cuda-bindings, nvidia-cublas-cu12,"
    )
    assert "3.1 GB of wheels for the build to download, 2.3 GB of them CUDA's" in said
    assert 'packages = ["torch==2.13.0+cpu"]' in said and "download.pytorch.org/whl/cpu" in said


def test_a_cpu_lock_says_nothing_and_asks_no_size() -> None:
    asked: list[str] = []
    report = _report({"torch": "https://example.invalid/torch-2.13.0+cpu.whl", "numpy": "https://x.invalid/n.whl"})
    assert cuda.check(report, ["torch", "numpy"], size_of=lambda u: asked.append(u) or 1) is None
    assert asked == []


def test_unknown_sizes_are_said_as_such() -> None:
    assert cuda.warning(["triton"], {"triton": None}) is not None
    assert "download size unknown" in (cuda.warning(["triton"], {"triton": None}) or "")
    partial = cuda.warning(["triton"], {"triton": 2_000_000, "torch": None}) or ""
    assert "at least 2.0 MB" in partial
    assert cuda.warning([], {"x": 1}) is None


def test_a_url_with_credentials_is_never_asked() -> None:
    assert cuda._size("https://user:secret@index.example/w.whl") is None


TARGET = WheelTarget(python_version="3.11", wheel_platform="manylinux_2_36_x86_64", source="settings")


def _wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    )
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", meta)
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


def test_nodekit_lock_warns_before_the_build_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    links = tmp_path / "links"
    links.mkdir()
    for var, value in (("PIP_CONFIG_FILE", "/dev/null"), ("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", str(links)),
                       ("PIP_NO_CACHE_DIR", "1")):  # fmt: skip
        monkeypatch.setenv(var, value)
    _wheel(links, "gputorch", "2.0", ("nvidia-nccl-cu12==2.0", "triton==3.0"))
    _wheel(links, "nvidia-nccl-cu12", "2.0")
    _wheel(links, "triton", "3.0")
    proj = tmp_path / "proj"
    proj.mkdir()
    settings = Settings(project_dir=proj, name="t", script="train.py", packages=("gputorch==2.0",))
    rep = RecordingReporter()
    result = locking.lock(settings, rep, target=TARGET)
    assert [p.name for p in result.lock.packages] == ["gputorch", "nvidia-nccl-cu12", "triton"]
    (warned,) = [w for w in rep.said("warn") if "CUDA" in w]
    assert "2 CUDA packages (nvidia-nccl-cu12, triton)" in warned and "of wheels for the build to download" in warned
    assert rep.events.index(("warn", warned)) < rep.events.index(("done", rep.said("done")[-1]))
