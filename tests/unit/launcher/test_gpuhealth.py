"""GPU health: the parsers and the verdicts on what the real tools printed (fixtures/gpu, sources in its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodekit.launcher.gpuhealth import gather
from nodekit.launcher.gpuhealth.judge import NodeHealth, judge, render
from nodekit.launcher.gpuhealth.parse import parse_dcgmi_diag, parse_smi_q, parse_xids, same_gpu
from nodekit.launcher.store.kv import Hosted, Table

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_every_fixture_has_its_source_in_the_readme() -> None:
    readme = text("README.md")
    for f in [*FIXTURES.glob("*.txt"), *FIXTURES.glob("*.csv")]:
        row = next((line for line in readme.splitlines() if f"`{f.name}`" in line), "")
        assert "https://" in row or "gpu_device_run.sh" in row or "the same run" in row, f.name


def test_a100_with_a_pending_row_remap_is_named_with_its_index_bus_and_the_reset() -> None:
    smi = parse_smi_q(text("smi_q_a100_remap_pending.txt"))
    assert smi.attached == 8 and smi.driver == "510.73.08"
    (gpu,) = smi.gpus
    assert (gpu.bus_id, gpu.product) == ("00000000:10:1C.0", "NVIDIA A100-SXM4-80GB")
    assert (gpu.volatile_uncorrectable, gpu.remap_pending, gpu.remap_failure) == (0, True, False)
    assert gpu.retirement_pending is None  # N/A on an A100: rows are remapped, not pages retired
    node = judge(1, "gpu-7", smi, xids=parse_xids(text("dmesg_xid63.txt")))
    sick = [f for f in node.findings if f.sick]
    assert [f.gpu for f in sick] == ["GPU 0 (00000000:10:1C.0, NVIDIA A100-SXM4-80GB)"]
    assert "row remapping pending" in sick[0].what and "nvidia-smi -r -i 0" in sick[0].fix
    # The Xid 63 of the same GPU (the kernel's short PCI form) is found on it, as a note: the remap says it all.
    (note,) = [f for f in node.findings if not f.sick]
    assert note.gpu.startswith("GPU 0 ") and "Xid 63" in note.what


def test_uncorrectable_rows_pending_are_counted() -> None:
    (gpu,) = parse_smi_q(text("smi_q_remapped_rows_uncorrectable.txt")).gpus
    assert (gpu.remap_uncorrectable, gpu.remap_pending) == (4, True)
    (f,) = judge(0, "h", parse_smi_q(text("smi_q_remapped_rows_uncorrectable.txt"))).findings
    assert f.sick and "4 uncorrectable row(s)" in f.what


def test_a_whole_healthy_h200_report_agrees_with_nvidia_smis_own_csv_and_gives_no_finding() -> None:
    """The device check's own outputs (a lent H200): the parser against the CSV query of the same GPU."""
    smi = parse_smi_q(text("smi_q_h200_healthy_whole.txt"))
    assert (smi.attached, smi.driver, smi.unreachable, smi.no_devices) == (1, "580.159.04", [], False)
    (gpu,) = smi.gpus
    (index, bus, ecc, retired, remap) = [c.strip() for c in text("smi_query_h200_healthy.csv").split(",")]
    assert (gpu.index, gpu.bus_id.upper(), gpu.volatile_uncorrectable) == (int(index), bus.upper(), int(ecc))
    assert (retired, gpu.retirement_pending) == ("[N/A]", None)  # Hopper remaps rows; no page retirement
    assert (remap, gpu.remap_pending, gpu.remap_failure, gpu.remap_uncorrectable) == ("No", False, False, 0)
    assert (gpu.product, gpu.aggregate_uncorrectable, gpu.throttle) == ("NVIDIA H200", 0, ["Idle"])
    xids = parse_xids(text("dmesg_h200_boot.txt"))
    assert xids == []
    assert not judge(0, "vm", smi, xids=xids).findings


def test_a_power_brake_on_a_v100_is_sick_and_says_where_to_look() -> None:
    smi = parse_smi_q(text("smi_q_v100_power_brake.txt"))
    (gpu,) = smi.gpus
    assert gpu.throttle == ["HW Slowdown", "HW Power Brake Slowdown"]
    (f,) = judge(2, "c4130", smi).findings
    assert f.sick and "HW Slowdown, HW Power Brake Slowdown" in f.what and "power supply" in f.fix


@pytest.mark.parametrize(
    "name", ["smi_q_throttle_idle.txt", "smi_q_memory_performance_4gpu.txt", "smi_q_reset_status.txt"]
)
def test_healthy_outputs_give_no_finding(name: str) -> None:
    smi = parse_smi_q(text(name))
    assert smi.gpus, name
    assert judge(0, "h", smi).findings == ()


def test_the_newer_clocks_event_reasons_section_is_read_too() -> None:
    smi = parse_smi_q(text("smi_q_memory_performance_4gpu.txt"))
    assert smi.attached == 4 and smi.gpus[0].bus_id == "00000000:42:00.0" and smi.gpus[0].throttle == []
    idle = parse_smi_q(text("smi_q_throttle_idle.txt")).gpus[0]
    assert idle.throttle == ["Idle"]  # read, and not a finding


@pytest.mark.parametrize(
    ("name", "bus"), [("smi_unknown_error.txt", "0000:0B:00.0"), ("smi_unknown_error_short_domain.txt", "000:BA:80.0")]
)
def test_a_gpu_nvidia_smi_cannot_reach_is_lost(name: str, bus: str) -> None:
    smi = parse_smi_q(text(name))
    assert smi.unreachable == [(bus, "Unknown Error")]
    node = judge(3, "n3", smi, expected=(8, "declared ([nodes.3] gpus)"))
    lost, count = node.findings
    assert lost.sick and lost.gpu == f"GPU at {bus}" and "lost" in lost.what and "reboot" in lost.fix
    assert count.sick and count.what == "0 GPU(s) visible, 8 declared ([nodes.3] gpus)"


def test_fallen_off_the_bus_with_and_without_an_xid() -> None:
    (x,) = parse_xids(text("dmesg_fallen_off_the_bus.txt"))
    assert (x.pci, x.code) == ("0000:b3:00.0", 79)
    (y,) = parse_xids(text("dmesg_xid79.txt"))
    assert (y.pci, y.code, y.text) == ("0000:44:00", 79, "GPU has fallen off the bus")
    (f,) = judge(0, "h", None, xids=[y]).findings
    assert f.sick and f.gpu == "GPU at PCI 0000:44:00" and "reseat" in f.fix


def test_kernel_and_nvidia_smi_addresses_match_across_their_spellings() -> None:
    assert same_gpu("0000:10:1c", "00000000:10:1C.0")
    assert same_gpu("0000:b3:00.0", "00000000:B3:00.0")
    assert not same_gpu("0000:10:1c", "00000000:10:1D.0")


def test_dcgmi_deployment_table_passes_and_an_error_row_names_the_gpu() -> None:
    rows = parse_dcgmi_diag(text("dcgmi_diag_deployment_pass.txt"))
    assert [r.name for r in rows][:3] == ["Denylist", "NVML Library", "CUDA Main Library"]
    assert {r.result for r in rows} == {"Pass"} and len(rows) == 9
    assert judge(0, "h", None, diag=rows).findings == ()
    (row,) = parse_dcgmi_diag(text("dcgmi_diag_remap_error.txt"))
    assert row.result == "GPU 3 has uncorrectable memory errors and row remappings are pending"
    (f,) = judge(0, "h", None, diag=[row]).findings
    assert f.sick and f.gpu == "GPU 3" and "dcgmi diag -r 3" in f.fix


def test_the_report_names_the_sick_node_and_refuses_only_when_asked() -> None:
    good = judge(0, "n0", parse_smi_q(text("smi_q_memory_performance_4gpu.txt")))
    bad = judge(1, "n1", parse_smi_q(text("smi_q_a100_remap_pending.txt")))
    warn = render([bad, good], refuse=False)
    assert warn.splitlines()[0].startswith("nodekit gpu health: WARNING, sick GPU on node(s) 1")
    assert "node 1 (n1) GPU 0 (00000000:10:1C.0, NVIDIA A100-SXM4-80GB): row remapping pending" in warn
    assert "fix: reset the GPU (`nvidia-smi -r -i 0`" in warn
    assert "(exit 21)" in render([good, bad], refuse=True).splitlines()[0]
    assert render([good], refuse=True).startswith("nodekit gpu health: ok, 1 node(s), 4 GPU(s)")
    assert render([NodeHealth(0, "cpu", 0)], refuse=True) == ""  # no GPU anywhere: nothing to say


def test_node_health_round_trips_through_json() -> None:
    node = judge(1, "n1", parse_smi_q(text("smi_q_a100_remap_pending.txt")), checked=["nvidia-smi -q"])
    assert NodeHealth.from_json(node.to_json()) == node
    assert json.loads(node.to_json())["findings"][0]["sick"] is True


def test_check_node_runs_the_tools_with_deadlines_and_says_what_could_not_run() -> None:
    calls: list[tuple[list[str], float]] = []
    outputs = {
        "nvidia-smi": (0, text("smi_q_a100_remap_pending.txt")),
        "dmesg": (1, "dmesg: read kernel buffer failed: Operation not permitted"),
        "dcgmi": (0, text("dcgmi_diag_remap_error.txt")),
    }

    def run(argv: list[str], timeout: float) -> tuple[int, str] | None:
        calls.append((argv, timeout))
        return outputs.get(argv[0])

    node = gather.check_node(1, "n1", expected=None, dcgm=True, run=run)
    assert [c[0] for c in calls] == [["nvidia-smi", "-q"], ["dmesg"], ["dcgmi", "diag", "-r", "1"]]
    assert all(0 < t <= gather.DIAG_TIMEOUT_S for _, t in calls)
    assert node.checked == ("nvidia-smi -q", "kernel log unreadable here", "dcgmi diag -r 1")
    assert [f.gpu for f in node.findings if f.sick] == ["GPU 0 (00000000:10:1C.0, NVIDIA A100-SXM4-80GB)", "GPU 3"]
    calls.clear()
    none = gather.check_node(0, "cpu", expected=None, dcgm=True, run=lambda argv, t: None)
    assert none.gpus == 0 and none.findings == () and none.checked == ("no nvidia-smi",)


def test_expected_count_is_the_declared_one_else_slurms() -> None:
    assert gather.expected_gpus(1, ((1, 4),), {"SLURM_GPUS_ON_NODE": "8"}) == (4, "declared ([nodes.1] gpus)")
    assert gather.expected_gpus(0, ((1, 4),), {"SLURM_GPUS_ON_NODE": "8"})[0] == 8  # type: ignore[index]
    assert gather.expected_gpus(0, (), {}) is None


def test_every_node_reads_every_nodes_findings_through_the_store() -> None:
    store = Hosted(Table(), 5.0, port=0, run_id=b"r", close=lambda: None, stats=lambda: None)
    bad = judge(1, "n1", parse_smi_q(text("smi_q_a100_remap_pending.txt")))
    store.set("nodekit/health/1", bad.to_json())
    store.set("nodekit/health-seen/1", "1")
    nodes = gather.share(store, NodeHealth(0, "n0", 0), 2, timeout_s=2.0)
    assert [n.rank for n in nodes] == [0, 1] and nodes[1] == bad
