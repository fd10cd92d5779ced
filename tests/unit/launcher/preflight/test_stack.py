"""Parsing what a node reports about its GPUs and driver; the torch part of gathering runs only in the image."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from nodekit.launcher.config import parse_env
from nodekit.launcher.preflight import stack as facts
from nodekit.launcher.preflight.stack import parse_nvidia_smi, parse_proc_driver
from tests.factories import LAUNCH_ENV


def test_nvidia_smi_rows() -> None:
    out = "NVIDIA H100 80GB HBM3, 570.133.20\n" * 8
    assert parse_nvidia_smi(out) == ("NVIDIA H100 80GB HBM3", 8, "570.133.20")
    mixed = "NVIDIA A100-SXM4-40GB, 550.54.15\nNVIDIA L4, 550.54.15\n"
    assert parse_nvidia_smi(mixed) == ("NVIDIA A100-SXM4-40GB + NVIDIA L4", 2, "550.54.15")
    assert parse_nvidia_smi("") == ("", 0, "")


def test_proc_driver_version() -> None:
    line = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
    assert parse_proc_driver(line) == "550.54.15"
    assert parse_proc_driver("garbage") == ""


def test_without_nvidia_smi_the_launcher_never_touches_torch_cuda(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """torch.cuda.device_count/get_device_name initialise CUDA here and hold GPU 0's memory for the whole job."""
    touched: list[str] = []

    class Cuda:
        def __getattr__(self, name: str) -> Any:
            touched.append(name)
            raise AssertionError(f"torch.cuda.{name} touched")

    fake = types.ModuleType("torch")
    fake.__version__ = "2.13.0"  # type: ignore[attr-defined]
    fake.version = types.SimpleNamespace(cuda="12.4")  # type: ignore[attr-defined]
    fake.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 90100))  # type: ignore[attr-defined]
    fake.cuda = Cuda()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(facts, "_gpus_from_nvidia_smi", lambda: ("", 0, ""))
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (tmp_path / "dev" / name).write_text("")
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (tmp_path / "gpus" / bus).mkdir(parents=True)
        (tmp_path / "gpus" / bus / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 1\n")
    real = facts._gpus_from_proc
    monkeypatch.setattr(facts, "_gpus_from_proc", lambda: real(str(tmp_path / "dev"), str(tmp_path / "gpus")))
    got = facts.gather(parse_env(LAUNCH_ENV), "10.0.0.6")
    assert [n for n in touched if n != "nccl"] == []
    assert (got.gpu_model, got.gpu_count, got.cuda, got.cudnn) == ("NVIDIA H100 80GB HBM3", 2, "12.4", "90100")
