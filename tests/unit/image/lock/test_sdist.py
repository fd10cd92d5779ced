"""Every real library resolves, or the lock says why.

Source distributions are built into wheels on the host, reproducibly, and locked by hash; compiled ones are
refused by name; a top-level requirement never settles silently below its newest release. The tests run the real
pip and the real setuptools, offline, against real sdists and wheels made here in a find-links directory (see
``index`` in tests/unit/image/conftest.py); only the setuptools wheel for pip's isolated build environments comes
from the host's pip sources, once per session (``setuptools_wheel`` in tests/conftest.py), as
tests/integration/test_packaging.py gets hatchling.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.errors import BuildError, ConfigError
from nodekit.image import lock as locking
from nodekit.image.lock import BuiltWheel, parse_lock
from nodekit.system.progress import RecordingReporter
from tests.factories import fake_wheel, make_sdist, project

pytestmark = pytest.mark.usefixtures("no_engine")

WHERE = "Python 3.11 on manylinux_2_36_x86_64"  # nodekit's own base, known without an engine


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sdindex(index: Path, setuptools_wheel: Path) -> Path:
    """The offline index, with setuptools for pip's isolated build environments."""
    shutil.copy(setuptools_wheel, index)
    return index


@pytest.fixture
def umask_077() -> Iterator[None]:
    """Build as a user whose umask differs from the lock's maker's (file modes are stored in a wheel)."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_built_lines_round_trip_and_must_name_a_pinned_package() -> None:
    text = (
        "# python: 3.11\n# platform: manylinux_2_36_x86_64\n# input: sdonly\n"
        f"# built: sdonly==1.0 from sha256:{'a' * 64} with setuptools==80.9.0 wheel==0.45.1\n"
        f"sdonly==1.0 --hash=sha256:{'b' * 64}\n"
    )
    lk = parse_lock(text)
    assert lk.built == (
        BuiltWheel(
            name="sdonly", version="1.0", sdist_sha256="a" * 64, backend=("setuptools==80.9.0", "wheel==0.45.1")
        ),
    )
    assert parse_lock(lk.text()) == lk and "# built: sdonly==1.0 from sha256:" in lk.text()
    with pytest.raises(ConfigError, match=r"says it built other 1\.0, which it does not pin"):
        parse_lock(text.replace("# built: sdonly", "# built: other"))
    with pytest.raises(ConfigError, match=r"line 4 is not `# built: "):
        parse_lock(text.replace("from sha256:", "from md5:"))


def test_a_package_published_only_as_an_sdist_is_built_locked_and_installs_offline(
    tmp_path: Path, sdindex: Path, umask_077: None
) -> None:
    sdist = make_sdist(sdindex, "sdonly", "1.0")
    proj = tmp_path / "proj"
    proj.mkdir()
    result = locking.lock(project(proj, ["sdonly"]), RecordingReporter())
    pin = result.lock.get("sdonly")
    assert pin is not None and pin.version == "1.0"
    (record,) = result.lock.built
    assert (record.name, record.version, record.sdist_sha256) == ("sdonly", "1.0", sha256(sdist))
    assert [b.split("==")[0] for b in record.backend] == ["setuptools"]
    text = (proj / "nodekit.lock").read_text()
    assert f"# built: sdonly==1.0 from sha256:{sha256(sdist)} with setuptools==" in text
    assert parse_lock(text) == result.lock
    (wheel,) = (proj / ".nodekit" / "wheelhouse").glob("sdonly-*.whl")
    assert wheel.name == "sdonly-1.0-py3-none-any.whl" and sha256(wheel) == pin.hashes[0]

    # Another checkout has the lock and no wheelhouse: it builds the same bytes (here under umask 077).
    clone = tmp_path / "clone"
    clone.mkdir()
    rep = RecordingReporter()
    wheels = locking.ensure_wheelhouse(project(clone, ["sdonly"], text), parse_lock(text), rep)
    assert wheels["sdonly"].read_bytes() == wheel.read_bytes()
    assert any("building sdonly 1.0 again" in s for s in rep.said("step"))

    # What the image runs: offline, every hash required.
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--require-hashes", "--no-deps", "--quiet",
         "--find-links", str(wheels["sdonly"].parent), "--target", str(site), "-r", str(clone / "nodekit.lock")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (site / "sdonly.py").read_text() == 'VERSION = "1.0"\n'

    # Re-locking with the wheel at hand builds nothing and keeps the file.
    rep = RecordingReporter()
    again = locking.lock(project(proj, ["sdonly"]), rep)
    assert not again.written and again.lock == result.lock
    assert not any("building" in s for s in rep.said("step"))


def test_a_rebuild_that_gives_other_bytes_than_the_lock_is_refused(
    tmp_path: Path, sdindex: Path, setuptools_wheel: Path
) -> None:
    sdist = make_sdist(sdindex, "sdonly", "1.0")
    backend = "setuptools==" + setuptools_wheel.name.split("-")[1]
    text = (
        f"# python: 3.11\n# platform: manylinux_2_36_x86_64\n# input: sdonly\n"
        f"# built: sdonly==1.0 from sha256:{sha256(sdist)} with {backend}\nsdonly==1.0 --hash=sha256:{'0' * 64}\n"
    )
    settings = project(tmp_path, ["sdonly"], text)
    with pytest.raises(BuildError, match=r"sdonly 1\.0 built again .* the build is not reproducible") as e:
        locking.ensure_wheelhouse(settings, parse_lock(text), RecordingReporter())
    assert "nodekit lock" in (e.value.fix or "")
    assert not list((tmp_path / ".nodekit" / "wheelhouse").glob("*.whl"))


def test_the_newest_release_is_locked_when_a_dependency_has_only_an_sdist(tmp_path: Path, sdindex: Path) -> None:
    """The lightly-train shape: its newest release needs a dependency published only as a source distribution
    (hydra-core -> antlr4-python3-runtime==4.9.*); left to itself, pip settles silently on the empty release 0.0.0."""
    fake_wheel(sdindex, "toplib", "0.0.0")
    fake_wheel(sdindex, "toplib", "1.0", ("midlib>=1",))
    fake_wheel(sdindex, "midlib", "1.0", ("leaf==4.9.*",))
    fake_wheel(sdindex, "leaf", "4.10")  # later releases have wheels; the one midlib needs has none
    make_sdist(sdindex, "leaf", "4.9.3")
    dry = locking.lock(project(tmp_path, ["toplib"]), RecordingReporter(), dry_run=True)
    assert not (tmp_path / "nodekit.lock").exists() and not (tmp_path / ".nodekit").exists()
    result = locking.lock(project(tmp_path, ["toplib"]), RecordingReporter())
    assert [(p.name, p.version) for p in result.lock.packages] == [
        ("leaf", "4.9.3"),
        ("midlib", "1.0"),
        ("toplib", "1.0"),
    ]
    assert [b.name for b in result.lock.built] == ["leaf"] and dry.lock == result.lock


def test_a_top_level_package_whose_newest_release_is_an_sdist_gets_that_release(tmp_path: Path, sdindex: Path) -> None:
    fake_wheel(sdindex, "newer", "1.0")
    make_sdist(sdindex, "newer", "2.0")
    rep = RecordingReporter()
    result = locking.lock(project(tmp_path, ["newer"]), rep)
    assert result.lock.get("newer").version == "2.0"  # type: ignore[union-attr]
    assert [b.name for b in result.lock.built] == ["newer"]
    assert any("newer: pip first settled on 1.0; 2.0 resolves too" in s for s in rep.said("step"))


def test_a_pin_that_forces_an_older_release_fails_naming_both_versions_and_the_pin(
    tmp_path: Path,
    index: Path,
) -> None:
    fake_wheel(index, "foo", "1.0", ("bar>=1",))
    fake_wheel(index, "foo", "2.0", ("bar>=2",))
    fake_wheel(index, "bar", "1.0")
    fake_wheel(index, "bar", "2.0")
    with pytest.raises(ConfigError) as e:
        locking.lock(project(tmp_path, ["bar==1.0", "foo"]), RecordingReporter())
    line = e.value.one_line()
    assert f"foo would resolve to 1.0, below its newest release for {WHERE}, 2.0" in line, line
    assert "foo 2.0 depends on bar>=2" in line and "nodekit.toml asks for bar==1.0" in line, line
    assert "pin foo==1.0 in nodekit.toml" in (e.value.fix or "") and "\n" not in line
    assert e.value.exit_code == 2 and not (tmp_path / "nodekit.lock").exists()
    # the user's own choice is respected: a pin, or a specifier whose newest is the older release
    assert locking.lock(project(tmp_path, ["bar==1.0", "foo==1.0"]), RecordingReporter()).written
    assert locking.lock(project(tmp_path, ["bar==1.0", "foo<2"]), RecordingReporter()).lock.get("foo").version == "1.0"  # type: ignore[union-attr]


def test_a_previous_pin_below_the_newest_is_kept_and_reported(tmp_path: Path, index: Path) -> None:
    fake_wheel(index, "delta", "1.0")
    locking.lock(project(tmp_path, ["delta", "gamma==1.0"]), RecordingReporter())
    fake_wheel(index, "delta", "2.0")
    rep = RecordingReporter()
    result = locking.lock(project(tmp_path, ["delta", "gamma==2.0"]), rep)
    assert result.lock.get("delta").version == "1.0"  # type: ignore[union-attr]
    warned = [w for w in rep.said("warn") if w.startswith("delta stays at 1.0")]
    assert warned and f"its newest release for {WHERE} is 2.0 (nodekit lock --upgrade moves it)" in warned[0]
    upgraded = locking.lock(project(tmp_path, ["delta", "gamma==2.0"]), RecordingReporter(), upgrade=True)
    assert upgraded.diff.changed == ("delta 1.0 -> 2.0",)


def test_a_compiled_sdist_is_refused_by_name_with_the_fix(tmp_path: Path, sdindex: Path) -> None:
    make_sdist(sdindex, "cext", "1.0", c_ext=True)
    with pytest.raises(ConfigError) as e:
        locking.lock(project(tmp_path, ["cext"]), RecordingReporter())
    line = e.value.one_line()
    assert line.startswith(f"cext 1.0 has no wheel for {WHERE}, and its source distribution "), line
    if shutil.which("cc") or shutil.which("gcc"):  # without a compiler the build fails instead, with the same fix
        assert re.search(r"builds a compiled wheel \(cext-1\.0-cp\d+-cp\d+-linux_\w+\.whl\) for this host", line), line
    assert "pin a cext version that has a wheel" in (e.value.fix or "")
    assert "install cext in the base image" in (e.value.fix or "")
    assert not (tmp_path / "nodekit.lock").exists()
    assert not list((tmp_path / ".nodekit" / "wheelhouse").glob("*.whl"))
