"""The command-line tier (python-on-whales' habit): the exact command each main operation runs, its environment
and its deadline, recorded by the fake runner (tests/fake_runner.py) with nothing executed."""

from __future__ import annotations

import pytest

from nodekit.errors import HostToolHung
from tests.fake_runner import FakeRunner


def test_nvidia_smi_lists_the_gpus_within_20_s_and_a_hang_is_one_line_exit_2(fake_runner: FakeRunner) -> None:
    from nodekit.host import facts

    fake_runner.on("nvidia-smi", stdout="NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n")
    assert facts.nvidia_smi_models() == ["NVIDIA H100 80GB HBM3"] * 2
    call = fake_runner.only("nvidia-smi")
    assert call.cmd == ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"] and call.deadline == 20
    fake_runner.on("nvidia-smi", hang=True)
    with pytest.raises(HostToolHung) as e:
        facts.nvidia_smi_models()
    assert e.value.exit_code == 2 and fake_runner.calls[-1].signals == [9]
    assert e.value.one_line().startswith("nvidia-smi did not finish within 20 s and was stopped (it hung). Fix: ")
