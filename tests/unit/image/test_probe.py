"""Bring your own base, the parts that need no engine: what the probe's answer means, which bases are
refused, which image `nodekit base` may name, resolving for the image's Python (markers included), package
sources without credentials in anything written, and locking against what the base already provides.

Resolution runs the real pip offline against fake wheels (the ``index`` fixture of tests/unit/image/conftest.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nodekit.errors import ConfigError, ImageError
from nodekit.image import lock as locking
from nodekit.image.debian import choose_base, own_suite
from nodekit.image.lock import parse_lock, redact, resolve_argv, source_options
from nodekit.image.probe import BaseStack, WheelTarget, check_usable, derive_target, parse_probe
from nodekit.system.progress import RecordingReporter
from tests.factories import fake_wheel, project

pytestmark = pytest.mark.usefixtures("no_engine")

CONDA = {
    "python": "/opt/conda/bin/python3",
    "kind": "conda",
    "version": "3.11.9",
    "implementation": "cpython",
    "libc": "glibc",
    "libc_version": "2.35",
    "machine": "x86_64",
    "pip": True,
    "ensurepip": True,
    "site": ["/opt/conda/lib/python3.11/site-packages"],
    "dists": {"torch": "2.5.0", "numpy": "2.1.0", "pip": "24.0"},
    "torch": {"__version__": "2.5.0+cu124", "cuda": "12.4", "git_version": "abc"},
}


def stack(**over: object) -> BaseStack:
    return parse_probe("sha256:" + "a" * 64, "noise\n" + json.dumps({**CONDA, **over}))


def test_probe_answer_gives_python_platform_and_what_the_base_provides() -> None:
    s = stack()
    assert (s.python_version, s.wheel_platform) == ("3.11", "manylinux_2_35_x86_64")
    assert (s.torch, s.cuda) == ("2.5.0+cu124", "12.4")
    assert s.provided() == {"torch": "2.5.0", "numpy": "2.1.0"}  # pip is the installer's, not the job's
    assert "conda" in s.describe() and "torch 2.5.0+cu124 (CUDA 12.4)" in s.describe()
    check_usable(s, "pytorch/pytorch:x")  # usable: no error


def test_bases_that_cannot_work_are_refused_naming_what_is_missing() -> None:
    none = parse_probe("sha256:" + "b" * 64, "nodekit-probe: no python\n")
    with pytest.raises(ImageError, match=r"^base image scratchy has no Python") as e:
        check_usable(none, "scratchy")
    assert e.value.exit_code == 2 and "Python >= 3.10" in (e.value.fix or "")
    with pytest.raises(ImageError, match=r"has Python 3\.8\.10 .*needs >= 3\.10"):
        check_usable(stack(version="3.8.10"), "old")
    with pytest.raises(ImageError, match="no way to install packages"):
        check_usable(stack(pip=False, ensurepip=False), "nopip")
    with pytest.raises(ImageError, match="printed no report"):
        parse_probe("sha256:x", "Traceback (most recent call last): boom")


def test_settings_override_the_probe_and_known_bases_answer_without_one() -> None:
    s = stack()
    assert derive_target("x", None, None, s).model_dump(exclude={"stack"}) == {
        "python_version": "3.11",
        "wheel_platform": "manylinux_2_35_x86_64",
        "source": "probe",
    }
    assert derive_target("x", "3.12", None, s).python_version == "3.12"
    assert derive_target("x", None, "manylinux_2_28_x86_64", s).wheel_platform == "manylinux_2_28_x86_64"
    known = derive_target("nodekit/base:trixie", None, None, None)
    assert (known.python_version, known.wheel_platform, known.source) == ("3.13", "manylinux_2_41_x86_64", "known base")
    with pytest.raises(ConfigError, match="without probing it"):
        derive_target("nvidia/cuda:12.4.1-runtime-ubuntu22.04", None, None, None)


def test_nodekit_base_only_ever_names_its_own_image() -> None:
    assert own_suite("nodekit/base:trixie") == "trixie" and own_suite("nvidia/cuda:12.4") is None
    assert choose_base("nodekit/base:bookworm", None, present=False) == ("nodekit/base:bookworm", "bookworm")
    assert choose_base("nvidia/cuda:12.4", "trixie", present=False) == ("nodekit/base:trixie", "trixie")
    with pytest.raises(ImageError, match=r"nvidia/cuda:12\.4 is not in the local Docker engine, and nodekit base") as e:
        choose_base("nvidia/cuda:12.4", None, present=False)
    assert "docker load nvidia/cuda:12.4" in (e.value.fix or "") and e.value.exit_code == 2
    with pytest.raises(ImageError, match="not nodekit's own base"):
        choose_base("nvidia/cuda:12.4", None, present=True)
    with pytest.raises(ImageError, match="sid"):
        choose_base("nodekit/base:bookworm", "sid", present=True)


def test_sources_become_pip_options_and_credentials_are_redacted() -> None:
    opts = source_options("https://u:s3cret@pypi.example/simple", ["https://download.pytorch.org/whl/cu124"], ["/w"])
    assert opts == [
        "--index-url", "https://u:s3cret@pypi.example/simple",
        "--extra-index-url", "https://download.pytorch.org/whl/cu124",
        "--find-links", "/w",
    ]  # fmt: skip
    assert (
        redact("cannot reach https://u:s3cret@pypi.example/simple/x/")
        == "cannot reach https://***@pypi.example/simple/x/"
    )
    assert redact("https://token@h/a and http://h/b") == "https://***@h/a and http://h/b"
    argv = resolve_argv(
        "py", Path("r"), Path("o"), Path("t"), None, python_version="3.13", platform="manylinux_2_41_x86_64"
    )
    markers = json.loads(argv[3])
    assert argv[1] == "-c" and markers["python_version"] == "3.13" and markers["platform_machine"] == "x86_64"


def _target(pv: str, platform: str, s: BaseStack | None = None) -> WheelTarget:
    return WheelTarget(python_version=pv, wheel_platform=platform, stack=s, source="settings")


def test_markers_are_evaluated_for_the_image_python_not_the_host(tmp_path: Path, index: Path) -> None:
    fake_wheel(index, "mark", "1.0", ('oldy; python_version < "3.12"', 'newy; python_version >= "3.12"'))
    fake_wheel(index, "oldy", "1.0")
    fake_wheel(index, "newy", "1.0")
    names = {}
    for pv, plat in (("3.11", "manylinux_2_36_x86_64"), ("3.13", "manylinux_2_41_x86_64")):
        proj = tmp_path / pv
        proj.mkdir()
        settings = project(proj, ["mark==1.0", "gamma==1.0; python_version >= '3.13'"])
        result = locking.lock(settings, RecordingReporter(), target=_target(pv, plat))
        names[pv] = [p.name for p in result.lock.packages]
        assert f"# python: {pv}" in (proj / "nodekit.lock").read_text()
    assert names == {"3.11": ["mark", "oldy"], "3.13": ["gamma", "mark", "newy"]}


def test_credentials_in_sources_never_reach_the_lock_or_the_error(tmp_path: Path, index: Path) -> None:
    (tmp_path / "nodekit.toml").write_text(
        'name = "t"\npackages = ["alpha==1.0"]\nextra_index_urls = ["http://user:hunter2@127.0.0.1:9/simple"]\n'
    )
    from nodekit.config.settings import load

    settings = load(tmp_path / "nodekit.toml")
    result = locking.lock(settings, RecordingReporter(), target=_target("3.11", "manylinux_2_36_x86_64"))
    assert "hunter2" not in (tmp_path / "nodekit.lock").read_text()
    assert [p.name for p in result.lock.packages] == ["alpha", "beta"]
    (tmp_path / "nodekit.toml").write_text(
        'name = "t"\npackages = ["nothere==1.0"]\nindex_url = "http://user:hunter2@127.0.0.1:9/simple"\n'
    )
    with pytest.raises(ConfigError) as e:
        locking.lock(
            load(tmp_path / "nodekit.toml"), RecordingReporter(), target=_target("3.11", "manylinux_2_36_x86_64")
        )
    assert "hunter2" not in e.value.one_line()


def test_what_the_base_provides_is_kept_not_locked_and_conflicts_name_both(tmp_path: Path, index: Path) -> None:
    # The base's torch is a version no index carries (as NGC's are): it resolves against a stub and stays out.
    fake_wheel(index, "lightish", "1.0", ("torch>=2.0", "beta>=1"))
    base = stack(dists={"torch": "2.5.0a0+nv24.10", "beta": "1.0"})
    settings = project(tmp_path, ["lightish==1.0"])
    result = locking.lock(settings, RecordingReporter(), target=_target("3.11", "manylinux_2_35_x86_64", base))
    assert [p.name for p in result.lock.packages] == ["lightish"]
    assert result.lock.provided == ("beta==1.0", "torch==2.5.0a0+nv24.10")
    text = (tmp_path / "nodekit.lock").read_text()
    assert "# provided: torch==2.5.0a0+nv24.10" in text and parse_lock(text) == result.lock
    assert result.lock.torch_version == "2.5.0a0+nv24.10"
    # the lock is checked against the base it was made for
    assert locking.check_lock(settings, _target("3.11", "manylinux_2_35_x86_64", base)) == result.lock
    other = stack(dists={"torch": "2.6.0", "beta": "1.0"})
    with pytest.raises(ConfigError, match=r"relies on the base image providing torch 2\.5\.0a0\+nv24\.10"):
        locking.check_lock(settings, _target("3.11", "manylinux_2_35_x86_64", other))

    clash = project(tmp_path, ["torch==2.13.0", "lightish==1.0"])
    with pytest.raises(ConfigError) as e:
        locking.lock(clash, RecordingReporter(), target=_target("3.11", "manylinux_2_35_x86_64", base))
    line = e.value.one_line()
    assert re.search(r"torch==2\.13\.0 \(the base image has torch 2\.5\.0a0\+nv24\.10\)", line), line
    assert "drop or relax" in line and "\n" not in line
