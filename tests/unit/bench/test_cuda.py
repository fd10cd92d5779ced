"""The CUDA benchmark's pure parts: which layer a history entry or a BuildKit log line is, BuildKit's own step
times, and the docs section rendered from a state file."""

from __future__ import annotations

import pytest

from benchmarks import _cuda_render, _cuda_ship
from benchmarks.cuda_bench import step_name, step_seconds

LOG = """\
#9 [env 2/6] RUN --mount=type=bind,from=cudalibs,target=/wheels     touch /tmp/.nodekit-run-start  && "${BASE
#9 DONE 101.2s
#10 [env 3/6] RUN --mount=type=bind,from=framework,target=/wheels     touch /tmp/.nodekit-run-start  && if grep
#10 CACHED
#11 [env 4/6] RUN --mount=type=bind,from=wheels,target=/wheels     touch /tmp/.nodekit-run-start  && if grep
#11 DONE 12.5s
"""


def test_layers_are_named_by_their_lock_files_or_contexts() -> None:
    assert (
        step_name("RUN |3 SOURCE_DATE_EPOCH=1 /bin/sh -c touch x && pip -r /wheels/cudalibs.lock") == "CUDA libraries"
    )
    assert step_name("RUN |3 ... /wheels/framework.lock; fi") == "framework"
    assert step_name("RUN |3 ... /wheels/packages.lock; fi") == "packages"
    assert step_name("COPY nodekit /opt/nodekit/nodekit # buildkit") == "launcher"
    assert step_name("COPY . /workspace/ and LABEL org.nodekit.* (written by nodekit build)") == "code"
    assert step_name("mmdebstrap") == "base"


def test_buildkit_step_times_skip_cached_steps() -> None:
    assert step_seconds(LOG) == {"CUDA libraries": 101.2, "packages": 12.5}


def test_buildkit_step_times_of_one_build_per_layer_whose_step_numbers_start_again() -> None:
    log = """\
#7 [cudalibs 2/2] RUN --mount=type=bind,from=cudalibs,target=/wheels     touch /tmp/.nodekit-run-start
#7 DONE 19.6s
#7 [framework 2/2] RUN --mount=type=bind,from=framework,target=/wheels     touch /tmp/.nodekit-run-start
#7 DONE 48.3s
#7 [packages 2/2] RUN --mount=type=bind,from=wheels,target=/wheels     touch /tmp/.nodekit-run-start
#7 DONE 5.0s
"""
    assert step_seconds(log) == {"CUDA libraries": 19.6, "framework": 48.3, "packages": 5.0}


def test_buildkit_step_times_of_the_layer_builds_running_at_once_are_told_apart_by_their_tags() -> None:
    """nodekit build --verbose with the three builds at once: their lines interleave, each tagged with its layer, and
    the same step number is open in two builds at a time."""
    log = """\
  env | #10 [env 2/2] RUN --mount=type=bind,from=cudalibs,target=/wheels     touch /tmp/.nodekit-run-start
  framework | #11 [env 2/2] RUN --mount=type=bind,from=cudalibs,target=/wheels     touch /tmp/.nodekit-run-start
  packages | #11 [env 2/2] RUN --mount=type=bind,from=cudalibs,target=/wheels     touch /tmp/.nodekit-run-start
  env | #10 DONE 4.3s
  framework | #11 DONE 4.3s
  packages | #11 DONE 4.3s
  framework | #12 [framework-build 1/1] RUN --mount=type=bind,from=framework,target=/wheels     mkdir -p /nodekit-layer
  packages | #12 [packages-build 1/1] RUN --mount=type=bind,from=wheels,target=/wheels     mkdir -p /nodekit-layer
  packages | #12 DONE 11.0s
  framework | #12 DONE 17.2s
"""
    assert step_seconds(log) == {"CUDA libraries": 4.3, "framework": 17.2, "packages": 11.0}


def _layer(step: str, size: int, diff: str) -> dict[str, object]:
    return {"step": step, "size": size, "diff_id": diff}


def test_the_docs_section_renders_the_build_the_upgrade_and_the_shipping() -> None:
    base = [_layer("base", 172_000_000, "b"), _layer("CUDA libraries", 3_415_000_000, "c")]
    top = [_layer("packages", 195_000_000, "p"), _layer("launcher", 116_000, "l"), _layer("code", 12_000, "x")]
    v1 = {"tag": "t1", "seconds": 166.0, "size": 5_950_000_000, "steps": {"CUDA libraries": 101.2},
          "layers": [*base, _layer("framework", 2_165_000_000, "f"), *top]}  # fmt: skip
    old = {**v1, "layers": [*base, _layer("framework", 2_160_000_000, "f0"), *top]}
    row = {"case": "a", "how": "layers", "targets": 1, "mbit": 1000, "seconds": 300.0, "link_bytes": 3 << 30,
           "nodekit_bytes": 3 << 30, "extra": "", "disk_peak": 11 << 30}  # fmt: skip
    bump = {"before": old, "after": v1, "lock_s": 9.0, "changed": ["torch 2.14.0 -> 2.14.1"], "added": [],
            "removed": [], "measured": "now"}  # fmt: skip
    state = {
        "build": {"v1": v1, "v2": v1, "v3": v1, "save_s": 60.0, "noop_s": 0.9, "lock_s": 20.0, "measured": "now"},
        "bump": bump,
        "ship_rows": [row],
        "ship_facts": {"measured": "now", "load": "1 2 3"},
    }
    text = _cuda_render.render(state)
    assert text.startswith(_cuda_render.TITLE)
    assert "cold build (--no-cache)" in text and "5.95 GB" in text and "torch 2.14.0 -> 2.14.1" in text
    # the upgrade sends the framework layer and those above it: 2.36 GB of 5.78 GB
    assert "2.36 GB uncompressed" in text and "rebuilds and sends 5.78 GB" in text and "2.4x smaller" in text
    assert "| (a) whole CUDA image, empty nodes |" in text and "GPU figures" in text


def test_cpu_used_records_the_machines_busy_and_iowait_seconds_of_the_block_rounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings = iter([(100.0, 5.0), (112.34, 5.56)])
    monkeypatch.setattr(_cuda_ship, "cpu_s", lambda: next(readings))
    with _cuda_ship.cpu_used() as cpu:
        assert cpu == {}
    assert list(cpu.items()) == [("cpu_busy_s", 12.3), ("cpu_iowait_s", 0.6)]
