"""Parsing what a node reports about its GPUs and driver; the torch part of gathering runs only in the image."""

from __future__ import annotations

from nodekit.launcher.facts import parse_nvidia_smi, parse_proc_driver


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
