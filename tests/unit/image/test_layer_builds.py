"""The package layers' builds run at once (nodekit/image/builder/driver.py): each is streamed into its blob, their
lines are tagged with the layer's name, and the first failure ends the others, also one still installing that has
sent nothing yet. A real process stands in for the docker CLI (as in tests/unit/system/docker/test_build_stops.py):
it answers each ``--target`` as its script below says."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from nodekit.errors import BuildError
from nodekit.image.blobs import BlobStore
from nodekit.image.builder import driver
from nodekit.image.plan import PACKAGE_LAYERS, BuildPlan
from nodekit.system import docker, proc
from nodekit.system.progress import RecordingReporter

# Each target: "tar" (a one-file layer at once), "tar-then-fail" (a whole archive, then an error), "fail" (BuildKit's
# error line after 0.5 s, exit 1) or "hang" (an install that sends nothing for 30 s). Every run writes its pid to
# <dir>/<target>.pid and, when a signal ends it, <dir>/<target>.ended.
FAKE_DOCKER = """#!{python}
import io, os, signal, sys, tarfile, time
target = sys.argv[sys.argv.index("--target") + 1]
plan = dict(p.split("=") for p in {plan!r}.split(","))
d = {dir!r}
open(os.path.join(d, target + ".pid"), "w").write(str(os.getpid()))
def ended(*_):
    open(os.path.join(d, target + ".ended"), "w").write("ended")
    sys.exit(143)
signal.signal(signal.SIGTERM, ended)
print(f"#7 [{{target}} 1/1] RUN --mount=type=bind,from=x,target=/wheels     pip install", file=sys.stderr, flush=True)
how = plan[target]
if how == "tar":
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = target.encode()
        info = tarfile.TarInfo(f"opt/{{target}}.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    print("#7 DONE 0.1s", file=sys.stderr, flush=True)
    sys.stdout.buffer.write(buf.getvalue())
elif how == "tar-then-fail":
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        tar.addfile(tarfile.TarInfo("opt/empty"))
    sys.stdout.flush()
    time.sleep(0.3)
    print("ERROR: failed to solve: exporting the layer: no space left on device", file=sys.stderr, flush=True)
    sys.exit(1)
elif how == "fail":
    time.sleep(0.5)
    print("#7 ERROR: process did not complete successfully: exit code: 1", file=sys.stderr, flush=True)
    sys.exit(1)
else:
    time.sleep(30)
"""


KEYS = {"env": "e" * 64, "framework": "f" * 64, "packages": "a" * 64}  # the blob store's keys are hex


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: dict[str, str]) -> Path:
    bin_dir, runs = tmp_path / "bin", tmp_path / "runs"
    bin_dir.mkdir()
    runs.mkdir()
    fake = bin_dir / "docker"
    text = ",".join(f"{k}={v}" for k, v in plan.items())
    fake.write_text(FAKE_DOCKER.format(python=sys.executable, plan=text, dir=str(runs)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return runs


def build_plan(tmp_path: Path) -> BuildPlan:
    """The parts of a plan the layer builds read (the context is never opened: the fake docker ignores it)."""
    plan = SimpleNamespace(context=tmp_path, dockerfile=tmp_path / "Dockerfile", build_contexts=(), build_args=(),
                           layer_keys=tuple(KEYS.items()))  # fmt: skip
    return cast("BuildPlan", plan)


def gone(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_three_layers_built_at_once_land_in_the_store_each_with_its_tagged_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, monkeypatch, {"layer-env": "tar", "layer-framework": "tar", "layer-packages": "tar"})
    store, rep = BlobStore(tmp_path / "blobs"), RecordingReporter()
    made = driver._make_layers(build_plan(tmp_path), PACKAGE_LAYERS, store, rep, no_cache=False)
    assert sorted(made) == ["env", "framework", "packages"]
    for layer in PACKAGE_LAYERS:
        record = made[layer.name]
        assert record.entries >= 1 and record.created_by == layer.created_by
        assert store.layer(KEYS[layer.name]) == record  # kept under the plan's key, for the next build
        assert store.verified_path(record.diff_id) is not None
    assert len({r.diff_id for r in made.values()}) == 3  # each build's own files, not one stream thrice
    assert rep.said("step") == ["building 3 layers at once: Python environment and CUDA libraries, framework, packages"]
    details = rep.said("detail")
    for name in ("env", "framework", "packages"):
        assert f"{name} | #7 DONE 0.1s" in details, details
        assert any(d.startswith(f"{name} | {name} layer ") for d in details)
    assert proc.live() == []


def test_one_missing_layer_is_built_alone_with_buildkits_steps_as_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, monkeypatch, {"layer-env": "fail", "layer-framework": "fail", "layer-packages": "tar"})
    store, rep = BlobStore(tmp_path / "blobs"), RecordingReporter()
    made = driver._make_layers(build_plan(tmp_path), PACKAGE_LAYERS[2:], store, rep, no_cache=False)
    assert list(made) == ["packages"]
    assert rep.said("step")[0] == "building the packages layer"
    assert rep.said("step")[1].startswith("[layer-packages 1/1] RUN --mount")


def test_the_first_failure_ends_the_other_builds_even_one_still_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = fake_docker(tmp_path, monkeypatch, {"layer-env": "tar", "layer-framework": "fail", "layer-packages": "hang"})
    store = BlobStore(tmp_path / "blobs")
    t0 = time.monotonic()
    with pytest.raises(BuildError) as failed:
        driver._make_layers(build_plan(tmp_path), PACKAGE_LAYERS, store, RecordingReporter(), no_cache=False)
    took = time.monotonic() - t0
    assert "process did not complete successfully" in failed.value.message  # the framework's own error
    assert "--target layer-framework" in (failed.value.fix or "")
    assert took < 10, f"the hanging build was not ended: {took:.1f} s"
    assert (runs / "layer-packages.ended").read_text() == "ended"
    assert gone(runs / "layer-packages.pid")
    assert store.layer(KEYS["framework"]) is None and store.layer(KEYS["packages"]) is None
    assert not list((tmp_path / "blobs" / "sha256").glob(".incoming.*"))  # no half-written blob left
    assert proc.live() == []


def test_a_set_stop_ends_a_build_that_has_sent_nothing_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = fake_docker(tmp_path, monkeypatch, {"layer-packages": "hang"})
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(BuildError):
        for _chunk in docker.buildx_export(tmp_path, dockerfile=tmp_path / "Dockerfile", target="layer-packages",
                                           build_contexts={}, build_args={}, stop=stop):  # fmt: skip
            pass
    assert time.monotonic() - t0 < 10
    assert (runs / "layer-packages.ended").read_text() == "ended"
    assert proc.live() == []


def test_a_build_that_fails_after_sending_its_files_is_an_error_not_a_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tar reader stops at the archive's end marker; BuildKit's exit code comes after it and is read too."""
    fake_docker(tmp_path, monkeypatch, {"layer-packages": "tar-then-fail"})
    store = BlobStore(tmp_path / "blobs")
    with pytest.raises(BuildError, match="no space left on device"):
        driver._make_layers(build_plan(tmp_path), PACKAGE_LAYERS[2:], store, RecordingReporter(), no_cache=False)
    assert store.layer(KEYS["packages"]) is None
    assert proc.live() == []
