"""Which image `nodekit up` runs when none is named: the project's fingerprint decides, a stale build is refused,
and without a fingerprint several candidates are refused rather than picked by (identical) creation time.

The engine's answers are stand-ins here (a dict of images); the decision is build.choose's
(nodekit/image/builder/selection.py)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image import builder as build
from nodekit.image.builder import selection
from nodekit.image.plan import LABEL_FINGERPRINT, LABEL_NAME
from nodekit.system import docker

OLD, NEW = "d5cc483dcf63" + "0" * 52, "d726855b19c7" + "1" * 52


def image(fp: str) -> docker.ImageInfo:
    """On the containerd store the engine's id (the manifest digest) and the identity differ: both are set, apart."""
    return docker.ImageInfo(
        id=f"sha256:{fp}", tags=(f"nodekit/p:{fp[:12]}",), labels={LABEL_NAME: "p", LABEL_FINGERPRINT: fp}, size=1,
        identity=f"sha256:{fp[::-1]}",
    )  # fmt: skip


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> dict[str, docker.ImageInfo]:
    images: dict[str, docker.ImageInfo] = {}
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: images.get(ref))
    monkeypatch.setattr(
        docker, "images_labelled", lambda label, value, host=None: [i for r, i in images.items() if r.startswith("n")]
    )
    return images


def settings(tmp_path: Path) -> Settings:
    return Settings(project_dir=tmp_path, name="p", script="train.py")


def test_a_stale_build_is_refused_with_the_fix(
    tmp_path: Path, engine: dict[str, docker.ImageInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine["nodekit/p:" + OLD[:12]] = image(OLD)
    monkeypatch.setattr(selection, "last_build", lambda s: {"tag": "nodekit/p:" + OLD[:12]})
    monkeypatch.setattr(selection, "project_fingerprint", lambda s, **_: (NEW, ""))
    with pytest.raises(ImageError) as info:
        build.choose(settings(tmp_path))
    assert "no longer matches the project" in info.value.message and NEW[:12] in info.value.message
    assert "nodekit up --build" in (info.value.fix or "") and "nodekit run --build" in (info.value.fix or "")


def test_the_image_matching_the_projects_fingerprint_wins_build_record_or_not(
    tmp_path: Path, engine: dict[str, docker.ImageInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine["nodekit/p:" + OLD[:12]] = image(OLD)
    engine["nodekit/p:" + NEW[:12]] = image(NEW)
    monkeypatch.setattr(selection, "project_fingerprint", lambda s, **_: (NEW, ""))
    for record in (None, {"tag": "nodekit/p:" + OLD[:12]}):
        monkeypatch.setattr(selection, "last_build", lambda s, r=record: r)
        ref, why, _ = build.choose(settings(tmp_path))
        assert ref == "nodekit/p:" + NEW[:12] and "fingerprint" in why


def test_a_tagged_image_wins_over_an_untagged_one_with_the_same_fingerprint(
    tmp_path: Path, engine: dict[str, docker.ImageInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild after the engine's build cache was pruned gave the same fingerprint another image id; the old one
    lost its tag. Choosing it gave tests and users a bare image id as the ref (seen in CI)."""
    tagged = image(NEW)
    engine["n-untagged"] = dataclasses.replace(tagged, id="sha256:" + "9" * 64, tags=())
    engine["nodekit/p:" + NEW[:12]] = tagged
    monkeypatch.setattr(selection, "project_fingerprint", lambda s, **_: (NEW, ""))
    monkeypatch.setattr(selection, "last_build", lambda s: None)
    ref, _, image_id = build.choose(settings(tmp_path))
    assert (ref, image_id) == ("nodekit/p:" + NEW[:12], tagged.identity)


@pytest.mark.parametrize("record", [False, True])
def test_plain_up_plans_with_the_same_id_as_up_image_and_run(
    tmp_path: Path, engine: dict[str, docker.ImageInfo], monkeypatch: pytest.MonkeyPatch, record: bool
) -> None:
    """Issue 46: plain `nodekit up` planned NODEKIT_IMAGE_ID from the engine's id, `up --image`/`up --build` and
    `nodekit run` from the image's identity: one image, two ids on one machine, and a false stack mismatch (17).
    Every way a node is started now names the image by its identity."""
    from nodekit.backends.compose.node import image_id_here

    tag = "nodekit/p:" + NEW[:12]
    engine[tag] = image(NEW)
    monkeypatch.setattr(docker, "require_image", lambda ref, host=None, node=None: engine[ref])
    if record:  # the project's fingerprint unknown here: the last build's record names the image
        monkeypatch.setattr(selection, "project_fingerprint", lambda s, **_: (None, "no lock"))
        monkeypatch.setattr(selection, "last_build", lambda s: {"tag": tag})
        monkeypatch.setattr(selection, "recorded_inputs", lambda r: None)
    else:
        monkeypatch.setattr(selection, "project_fingerprint", lambda s, **_: (NEW, ""))
        monkeypatch.setattr(selection, "last_build", lambda s: None)
    ref, _, chosen = build.choose(settings(tmp_path))
    assert ref == tag and chosen == image_id_here(0)(tag) == engine[tag].identity != engine[tag].id


def test_a_pushed_to_node_without_a_fingerprint_takes_its_only_image_and_refuses_to_guess_among_several(
    tmp_path: Path, engine: dict[str, docker.ImageInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selection, "last_build", lambda s: None)
    unknown = (None, "base image nodekit/base:bookworm is not here")
    monkeypatch.setattr(selection, "project_fingerprint", lambda s, **_: unknown)
    engine["nodekit/p:" + OLD[:12]] = image(OLD)
    ref, why, _ = build.choose(settings(tmp_path))
    assert ref == "nodekit/p:" + OLD[:12] and "only image" in why and "base image" in why
    engine["nodekit/p:" + NEW[:12]] = image(NEW)
    with pytest.raises(ImageError, match="2 images of p are here") as info:
        build.choose(settings(tmp_path))
    assert "--image" in (info.value.fix or "")


def test_the_fingerprint_is_unknown_without_a_lock(tmp_path: Path) -> None:
    fp, why = build.project_fingerprint(settings(tmp_path))
    assert fp is None and "nodekit.lock" in why


def test_a_second_build_of_the_project_waits_for_the_first(tmp_path: Path) -> None:
    """Staging replaces .nodekit/build/: two builds at once deleted each other's context."""
    import threading
    import time

    from nodekit.system.progress import RecordingReporter

    order: list[str] = []
    first_in = threading.Event()

    def first() -> None:
        with build.build_lock(tmp_path, RecordingReporter()):
            order.append("first in")
            first_in.set()
            time.sleep(0.3)
            order.append("first out")

    t = threading.Thread(target=first)
    t.start()
    first_in.wait(5)
    rep = RecordingReporter()
    with build.build_lock(tmp_path, rep):
        order.append("second in")
    t.join(5)
    assert order == ["first in", "first out", "second in"]
    assert any("another build of this project is running" in m for m in rep.said("step"))


def test_what_nodekit_writes_into_a_project_never_changes_its_code_fingerprint(tmp_path: Path) -> None:
    """No .dockerignore: `nodekit up` on one node writes compose/, outputs/ and .nodekit/; the next node must still
    find the image current (an empty compose/ left in the tree was once enough to call it stale)."""
    (tmp_path / "train.py").write_text("print('train')\n")
    s = settings(tmp_path)
    before = build.hash_tree(tmp_path, build.code_rules(s))
    (tmp_path / "compose").mkdir()
    (tmp_path / "compose" / "node-1.yaml").write_text("services: {}\n")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "ckpt.pt").write_bytes(b"\0")
    (tmp_path / ".nodekit").mkdir()
    (tmp_path / ".nodekit" / "job-secret").write_text("s\n")
    assert build.hash_tree(tmp_path, build.code_rules(s)) == before
    (tmp_path / "model.py").write_text("x = 1\n")
    assert build.hash_tree(tmp_path, build.code_rules(s)) != before


def test_a_node_without_its_unknown_base_falls_back_to_its_only_image(
    tmp_path: Path, engine: dict[str, docker.ImageInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that only received a pushed image, of a project on a base nodekit does not know and this engine does
    not have: the project's fingerprint cannot be known (no probe, no default), which is a reason, not an error."""
    shutil.copy(Path(__file__).resolve().parents[3] / "examples" / "ddp" / "nodekit.lock", tmp_path / "nodekit.lock")
    s = Settings(project_dir=tmp_path, name="p", script="train.py", base_image="example.org/custom:1")
    monkeypatch.setattr(selection, "last_build", lambda s: None)
    fp, why = build.project_fingerprint(s)
    assert fp is None and "cannot tell the Python and wheel platform of base image example.org/custom:1" in why
    engine["nodekit/p:" + OLD[:12]] = image(OLD)
    ref, why, image_id = build.choose(s)
    assert ref == "nodekit/p:" + OLD[:12] and "only image" in why and image_id == f"sha256:{OLD[::-1]}"
