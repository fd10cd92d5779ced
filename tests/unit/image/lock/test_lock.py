"""nodekit.lock: format, drift refusal, and re-locking that moves only what changed.

The resolution tests run the real pip, offline, against fake wheels in a find-links directory: the user's pip
configuration is replaced by PIP_* variables so nothing reaches an index.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from pathlib import Path

import pytest

from nodekit.errors import BuildError, ConfigError
from nodekit.image import lock as locking
from nodekit.image.lock import (
    Lock,
    LockedPackage,
    check_lock,
    compatible_platforms,
    diff_locks,
    parse_lock,
    target_options,
    unsatisfied,
)
from nodekit.system.progress import RecordingReporter
from tests.factories import fake_wheel, project

pytestmark = pytest.mark.usefixtures("no_engine")

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def sample() -> Lock:
    return Lock(
        python_version="3.11",
        platform="manylinux_2_36_x86_64",
        inputs=("torch==2.13.0", "numpy>=2"),
        packages=(
            LockedPackage(name="torch", version="2.13.0+cpu", hashes=(H1,)),
            LockedPackage(name="numpy", version="2.1.0", hashes=(H2,)),
            LockedPackage(name="typing-extensions", version="4.16.0", hashes=(H3,)),
        ),
    )


# --- format --------------------------------------------------------------------------------------------------


def test_text_is_sorted_hash_pinned_and_round_trips() -> None:
    text = sample().text()
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert body == [
        f"numpy==2.1.0 --hash=sha256:{H2}",
        f"torch==2.13.0+cpu --hash=sha256:{H1}",
        f"typing-extensions==4.16.0 --hash=sha256:{H3}",
    ]
    assert "# python: 3.11" in text and "# platform: manylinux_2_36_x86_64" in text
    assert "# input: torch==2.13.0" in text and "# input: numpy>=2" in text
    parsed = parse_lock(text)
    assert parsed.text() == text
    assert parsed.get("Typing_Extensions") == sample().get("typing-extensions")
    assert parsed.torch_version == "2.13.0+cpu"


@pytest.mark.parametrize(
    "text",
    [
        "# python: 3.11\n# platform: p\ntorch==2.13.0\n",  # no hash
        "# python: 3.11\n# platform: p\ntorch>=2 --hash=sha256:" + H1 + "\n",  # not pinned
        "# platform: p\ntorch==2.13.0 --hash=sha256:" + H1 + "\n",  # no python header
        "# python: 3.11\n# platform: p\n",  # nothing pinned
    ],
)
def test_malformed_lock_is_refused_with_fix(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_lock(text)
    assert e.value.fix == "nodekit lock"


# --- drift ---------------------------------------------------------------------------------------------------


def test_unsatisfied_names_each_problem() -> None:
    lk = sample()
    assert unsatisfied(lk, ["torch==2.13.0", "numpy>=2", "typing_extensions"]) == []  # +cpu satisfies ==2.13.0
    assert unsatisfied(lk, ["torch==2.14.0"]) == ["torch: the lock has 2.13.0+cpu, nodekit.toml asks for ==2.14.0"]
    assert unsatisfied(lk, ["lightning"]) == ["lightning is not in the lock"]
    # markers are evaluated for the image (Python 3.11, Linux), not for the host
    assert unsatisfied(lk, ['lightning; python_version < "3.10"', 'pywin32; sys_platform == "win32"']) == []
    assert unsatisfied(lk, ['lightning; python_version >= "3.11"']) == ["lightning is not in the lock"]
    assert "direct URL" in unsatisfied(lk, ["foo @ https://example.com/foo.whl"])[0]


def test_check_lock_refuses_missing_drifted_or_foreign_locks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no nodekit\.lock") as e:
        check_lock(project(tmp_path, ["torch==2.13.0"]))
    assert e.value.fix == "nodekit lock"

    settings = project(tmp_path, ["torch==2.13.0", "numpy>=2"], sample().text())
    assert check_lock(settings) == sample()

    settings = project(tmp_path, ["torch==2.13.0", "numpy>=3"], sample().text())
    with pytest.raises(ConfigError, match=re.escape("numpy: the lock has 2.1.0, nodekit.toml asks for >=3")) as e:
        check_lock(settings)
    assert e.value.fix == "nodekit lock"
    assert e.value.exit_code == 2

    settings = project(tmp_path, ["torch==2.13.0", "lightning"], sample().text())
    with pytest.raises(ConfigError, match="lightning is not in the lock"):
        check_lock(settings)

    other = sample().model_copy(update={"platform": "manylinux_2_28_aarch64"})
    with pytest.raises(ConfigError, match=re.escape("resolved for Python 3.11 on manylinux_2_28_aarch64")):
        check_lock(project(tmp_path, ["torch==2.13.0"], other.text()))


def test_removing_a_package_still_satisfies_but_is_reported_as_drift(tmp_path: Path) -> None:
    settings = project(tmp_path, ["torch==2.13.0"], sample().text())
    rep = RecordingReporter()
    lk, created = locking.ensure_lock(settings, rep)
    assert lk == sample() and not created
    assert any("changed since nodekit.lock" in w for w in rep.said("warn"))


def test_diff_locks() -> None:
    old = sample()
    new = old.model_copy(
        update={
            "packages": (
                LockedPackage(name="torch", version="2.13.0+cpu", hashes=(H1,)),
                LockedPackage(name="numpy", version="2.2.0", hashes=(H3,)),
                LockedPackage(name="sympy", version="1.14.0", hashes=(H2,)),
            )
        }
    )
    d = diff_locks(old, new)
    assert (d.added, d.removed, d.changed) == (("sympy",), ("typing-extensions",), ("numpy 2.1.0 -> 2.2.0",))
    assert diff_locks(old, old).empty


# --- resolving for the image's platform ---------------------------------------------------------------------


def test_compatible_platforms_include_older_glibc_and_legacy_names() -> None:
    tags = compatible_platforms("manylinux_2_36_x86_64")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_28_x86_64" in tags  # torch's wheels
    assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
    assert tags[-1] == "manylinux1_x86_64"
    assert compatible_platforms("manylinux_2_28_aarch64")[-1] == "manylinux2014_aarch64"
    assert compatible_platforms("linux_x86_64") == ("linux_x86_64",)
    opts = target_options("3.11", "manylinux_2_36_x86_64")
    assert opts[0] == "--only-binary=:all:"
    assert opts[-6:] == ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]


def changed_lines(before: str, after: str) -> list[str]:
    return [
        ln for ln in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    ]  # fmt: skip


def test_relock_changes_only_the_changed_package(tmp_path: Path, index: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    first = locking.lock(project(proj, ["alpha==1.0", "gamma==1.0"]), RecordingReporter())
    assert first.created and first.written
    assert [(p.name, p.version) for p in first.lock.packages] == [("alpha", "1.0"), ("beta", "1.0"), ("gamma", "1.0")]
    before = (proj / "nodekit.lock").read_text()

    fake_wheel(index, "beta", "2.0")  # a newer release of an unrelated dependency appears
    second = locking.lock(project(proj, ["alpha==1.0", "gamma==2.0"]), RecordingReporter())
    after = (proj / "nodekit.lock").read_text()
    assert second.kept_pins
    assert second.diff.changed == ("gamma 1.0 -> 2.0",)
    assert changed_lines(before, after) == [
        "-# input: gamma==1.0",
        "+# input: gamma==2.0",
        f"-gamma==1.0 --hash=sha256:{first.lock.get('gamma').hashes[0]}",  # type: ignore[union-attr]
        f"+gamma==2.0 --hash=sha256:{second.lock.get('gamma').hashes[0]}",  # type: ignore[union-attr]
    ]

    # re-locking unchanged inputs writes nothing
    again = locking.lock(project(proj, ["alpha==1.0", "gamma==2.0"]), RecordingReporter())
    assert not again.written and again.diff.empty

    # --upgrade resolves afresh and moves beta
    upgraded = locking.lock(project(proj, ["alpha==1.0", "gamma==2.0"]), RecordingReporter(), upgrade=True)
    assert upgraded.diff.changed == ("beta 1.0 -> 2.0",)


def test_relock_drops_previous_pins_only_when_they_conflict(tmp_path: Path, index: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    locking.lock(project(proj, ["alpha==1.0", "gamma==1.0"]), RecordingReporter())
    fake_wheel(index, "beta", "2.0")
    fake_wheel(index, "gamma", "3.0", ("beta>=2",))
    rep = RecordingReporter()
    result = locking.lock(project(proj, ["alpha==1.0", "gamma==3.0"]), rep)
    assert not result.kept_pins
    assert set(result.diff.changed) == {"beta 1.0 -> 2.0", "gamma 1.0 -> 3.0"}
    assert any("conflict" in w for w in rep.said("warn"))


def test_unresolvable_package_is_a_config_error(tmp_path: Path, index: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("cannot resolve packages for Python 3.11")) as e:
        locking.lock(project(tmp_path, ["nonexistent==1.0"]), RecordingReporter())
    assert "nodekit.toml" in (e.value.fix or "")
    assert not (tmp_path / "nodekit.lock").exists()


def test_dry_run_writes_nothing_and_build_creates_a_missing_lock(tmp_path: Path, index: Path) -> None:
    settings = project(tmp_path, ["gamma==1.0"])
    assert not locking.lock(settings, RecordingReporter(), dry_run=True).written
    assert not (tmp_path / "nodekit.lock").exists()
    rep = RecordingReporter()
    lk, created = locking.ensure_lock(settings, rep)
    assert created and (tmp_path / "nodekit.lock").read_text() == lk.text()
    assert any("no nodekit.lock yet" in w for w in rep.said("warn"))


def test_wheelhouse_is_refilled_from_the_lock_and_verified(tmp_path: Path, index: Path) -> None:
    settings = project(tmp_path, ["alpha==1.0"])
    lk = locking.lock(settings, RecordingReporter()).lock
    wheels = locking.ensure_wheelhouse(settings, lk, RecordingReporter())
    assert sorted(wheels) == ["alpha", "beta"]
    house = tmp_path / ".nodekit" / "wheelhouse"
    assert all(p.parent == house for p in wheels.values())

    # a missing wheel is fetched again; a corrupted one is replaced
    wheels["alpha"].unlink()
    wheels["beta"].write_bytes(b"corrupt")
    rep = RecordingReporter()
    again = locking.ensure_wheelhouse(settings, lk, rep)
    assert again == wheels
    assert hashlib.sha256(again["beta"].read_bytes()).hexdigest() == lk.get("beta").hashes[0]  # type: ignore[union-attr]
    assert any("fetching 2 wheel(s)" in s for s in rep.said("step"))

    # a wheel the index no longer has cannot be fetched: BuildError naming it
    wheels["alpha"].unlink()
    (index / wheels["alpha"].name).unlink()
    with pytest.raises(BuildError, match="alpha"):
        locking.ensure_wheelhouse(settings, lk, RecordingReporter())
