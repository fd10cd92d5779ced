"""`nodekit load --expect` on real engines of both image stores (issue 44, N4 of the 2026-12 review): a file that is
not exactly the expected image is refused before `docker load` moves any tag, and a good file still loads, with the
id `nodekit save` printed on either store.

The three attacks of the review, with images made by `docker import` (no registry here): A) the trojan's `docker
save`, rewritten so that its tag is the victim's; B) one file holding the expected image beside the trojan tagged as
the victim; C) `--expect ''`. After each, the victim tag still names the good image."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit import ship
from nodekit.errors import ShipError
from nodekit.system import docker
from nodekit.system.progress import NullReporter

pytestmark = pytest.mark.docker

GOOD, TROJAN, VICTIM = "nodekit/n4-good:1", "nodekit/n4-trojan:1", "nodekit/n4-victim:1"
STORES = ("classic", "containerd")


def dock(host: str | None, *args: str, data: bytes | None = None) -> bytes:
    argv = ["docker", *(["-H", host] if host else []), *args]
    proc = subprocess.run(argv, input=data, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


def imported(host: str | None, ref: str, text: bytes) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("etc/which")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    dock(host, "import", "-", ref, data=buf.getvalue())
    return image_id(host, ref) or ""


def image_id(host: str | None, ref: str) -> str | None:
    info = docker.image_info(ref, host)
    return info.id if info else None


def retagged(archive: bytes, old: str, new: str) -> bytes:
    """A `docker save` archive with the tag ``old`` rewritten to ``new`` in both manifest.json and index.json."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src:
            f = src.extractfile(m) if m.isfile() else None
            data = f.read() if f else b""
            if m.name in ("manifest.json", "index.json"):
                data = data.replace(old.encode(), new.encode())
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if m.isfile() else None)
    return out.getvalue()


def load(path: Path, host: str | None, *expect: str) -> subprocess.CompletedProcess[str]:
    to = ["--to", host] if host else []
    argv = [sys.executable, "-m", "nodekit", "load", str(path), *to, *(("--expect", *expect) if expect else ())]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=path.parent)


@pytest.fixture(params=STORES)
def engine(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The engine of one store, holding the good image (also tagged as the victim) and the trojan."""
    host: str | None = None
    if request.param == "containerd":
        host = request.getfixturevalue("containerd_engine")
    else:
        request.getfixturevalue("docker_engine")
    for ref in (GOOD, TROJAN, VICTIM):
        subprocess.run(["docker", *(["-H", host] if host else []), "rmi", "-f", ref], capture_output=True)
    imported(host, GOOD, b"GOOD image\n")
    imported(host, TROJAN, b"TROJAN image\n")
    dock(host, "tag", GOOD, VICTIM)
    yield host
    for ref in (GOOD, TROJAN, VICTIM):
        subprocess.run(["docker", *(["-H", host] if host else []), "rmi", "-f", ref], capture_output=True)


def short(image: str | None) -> str:
    return (image or "?").removeprefix("sha256:")[:12]


def test_attack_a_a_trojan_retagged_as_the_victim_moves_no_tag(engine: str | None, tmp_path: Path) -> None:
    good = image_id(engine, GOOD)
    path = tmp_path / "tampered.tar"
    path.write_bytes(retagged(dock(engine, "save", TROJAN), TROJAN, VICTIM))
    got = load(path, engine, short(good))
    assert image_id(engine, VICTIM) == good, "the victim tag moved"
    assert got.returncode == 1, got.stdout + got.stderr
    assert "was not loaded" in got.stderr and f"not {short(good)}" in got.stderr, got.stderr


def test_attack_b_the_expected_image_beside_a_trojan_is_refused(engine: str | None, tmp_path: Path) -> None:
    good = image_id(engine, GOOD)
    path = tmp_path / "two.tar"
    path.write_bytes(retagged(dock(engine, "save", GOOD, TROJAN), TROJAN, VICTIM))
    got = load(path, engine, short(good))
    assert image_id(engine, VICTIM) == good, "the victim tag moved"
    assert got.returncode == 1, got.stdout + got.stderr
    assert "holds 2 images" in got.stderr, got.stderr


def test_attack_c_an_empty_expect_is_refused_at_input(engine: str | None, tmp_path: Path) -> None:
    good = image_id(engine, GOOD)
    path = tmp_path / "tampered.tar"
    path.write_bytes(retagged(dock(engine, "save", TROJAN), TROJAN, VICTIM))
    for expect in ("", "sha256:", short(good)[:6]):
        got = load(path, engine, expect)
        assert image_id(engine, VICTIM) == good, f"the victim tag moved with --expect {expect!r}"
        assert got.returncode == 2, got.stdout + got.stderr
        assert "is not an image id" in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr


def test_a_tag_moved_despite_the_check_is_put_back(
    engine: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence, should the engine read a file otherwise than the check did: with the check
    switched off, the load moves the victim tag to the trojan, and nodekit puts it back."""
    good = image_id(engine, GOOD)
    path = tmp_path / "tampered.tar"
    path.write_bytes(retagged(dock(engine, "save", TROJAN), TROJAN, VICTIM))
    monkeypatch.setattr(ship.files, "check_expected", lambda contents, expect: None)
    with pytest.raises(ShipError) as e:
        ship.load(path, NullReporter(), endpoint=engine, expect_id=short(good))
    assert "was put back" in str(e.value)
    assert image_id(engine, VICTIM) == good


@pytest.mark.parametrize("target_store", STORES)
def test_a_good_file_loads_with_the_id_save_printed_on_either_store(
    engine: str | None, target_store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = request.getfixturevalue("containerd_engine") if target_store == "containerd" else None
    source = docker.require_image(GOOD, engine)
    path = tmp_path / "good.tar.gz"
    from_ = ["--from", engine] if engine else []
    saved = subprocess.run([sys.executable, "-m", "nodekit", "save", str(path), GOOD, *from_], capture_output=True,
                           text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    printed = re.search(rf"saved {re.escape(GOOD)} \(([0-9a-f]{{12}})\)", saved.stderr)
    assert printed is not None, saved.stderr
    subprocess.run(["docker", *(["-H", target] if target else []), "rmi", "-f", GOOD], capture_output=True)
    got = load(path, target, printed.group(1))
    assert got.returncode == 0, got.stdout + got.stderr
    there = docker.require_image(GOOD, target)
    assert there.identity == source.identity and f"{GOOD} {there.id}" in got.stdout
    if target != engine:
        subprocess.run(["docker", *(["-H", target] if target else []), "rmi", "-f", GOOD], capture_output=True)
