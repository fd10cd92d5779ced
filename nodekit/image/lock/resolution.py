"""Resolution: the config's packages -> pins for the image's Python and platform, from pip's dry-run report.

What the base image already installs is passed as constraints (with metadata-only stand-in wheels, so versions no
index carries resolve) and left out of the pins. Re-locking passes the previous pins as constraints, so changing one
package moves only that package unless the new requirement forces its dependencies to move.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from nodekit.config.settings import Settings
from nodekit.errors import ConfigError
from nodekit.image.lock import cuda
from nodekit.image.lock import pip as pipcmd
from nodekit.image.lock.format import BuiltWheel, Lock, LockedPackage, normalize_inputs, target_environment
from nodekit.image.lock.newest import checked, newest_versions, settle, versions
from nodekit.image.lock.sdist import Builder
from nodekit.image.lock.wheelhouse import find_wheel, wheelhouse_dir
from nodekit.launcher.datacheck.filehash import file_sha256
from nodekit.system.progress import Reporter

if TYPE_CHECKING:
    from nodekit.image.probe import WheelTarget


def stub_wheel(directory: Path, name: str, version: str) -> Path:
    """A metadata-only wheel standing for a distribution the base already has, so pip can resolve against
    versions no index carries (NGC's ``2.5.0a0+nv24.10``); it is never installed (the lock leaves it out)."""
    dist = f"{re.sub(r'[-.]+', '_', name)}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    files = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: nodekit\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}.dist-info/RECORD": "",
    }
    with zipfile.ZipFile(path, "w") as z:
        for arc, content in files.items():
            z.writestr(arc, content)
    return path


def base_conflicts(requirements: Sequence[str], provided: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """Pure: requirements that the base's installed versions cannot satisfy, as "req (the base has name v)"."""
    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(dict(env)):
            continue
        have = provided.get(canonicalize_name(req.name))
        if have is not None and not req.specifier.contains(have, prereleases=True):
            out.append(f"{text} (the base image has {req.name} {have})")
    return out


def read_report(
    report: Mapping[str, Any], provided: Mapping[str, str] | None = None
) -> tuple[list[LockedPackage], list[LockedPackage]]:
    """Pins from pip's installation report (format version 1), leaving out what the base ``provided`` at the
    resolved version (name -> version): the wheels', and the source distributions' (their hash is the sdist's)."""
    wheels: list[LockedPackage] = []
    sdists: list[LockedPackage] = []
    for item in report.get("install", []):
        name = canonicalize_name(item["metadata"]["name"])
        version = str(item["metadata"]["version"])
        if provided and provided.get(name) == version:
            continue
        info = item.get("download_info", {})
        hashes = info.get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise ConfigError(
                f"{name} {version} resolved to {pipcmd.redact(str(info.get('url', 'a source')))} without a sha256 "
                "(not an index's wheel or source distribution?)",
                fix="require a package available from your index or find-links",
            )
        pin = LockedPackage(name=name, version=version, hashes=(hashes["sha256"],))
        (wheels if str(info.get("url", "")).endswith(".whl") else sdists).append(pin)
    return wheels, sdists


def run_report(
    requirements: Sequence[str],
    constraints: Sequence[str],
    *,
    python_version: str,
    platform: str,
    sources: Sequence[str] = (),
    provided: Mapping[str, str] | None = None,
    full_version: str | None = None,
) -> dict[str, Any]:
    """pip's installation report for ``requirements`` on the image; ResolveFailed with pip's line when it fails."""
    with tempfile.TemporaryDirectory(prefix="nodekit-lock-") as tmp:
        d = Path(tmp)
        cons = None
        base = [f"{n}=={v}" for n, v in sorted((provided or {}).items())]
        if constraints or base:
            cons = d / "constraints.txt"
            cons.write_text(
                "\n".join([*base, *(c for c in constraints if c.split("==")[0] not in (provided or {}))]) + "\n"
            )
        extra = list(sources)
        if provided:
            stubs = d / "base-provides"
            stubs.mkdir()
            for n, v in provided.items():
                stub_wheel(stubs, n, v)
            extra += ["--find-links", str(stubs)]

        def argv(python: str, req: Path, report: Path, target: Path, **kw: Any) -> list[str]:
            return pipcmd.resolve_argv(python, req, report, target, cons, **kw)

        def failed(proc: pipcmd.Finished) -> pipcmd.ResolveFailed:
            return pipcmd.ResolveFailed(proc.stderr, proc.stdout)

        return pipcmd.dry_run_report(
            d, requirements, argv, what="pip resolving the lock", failed=failed,
            python_version=python_version, platform=platform, sources=extra, full_version=full_version,
        )  # fmt: skip


def build_sdists(
    sdists: Sequence[LockedPackage],
    builder: Builder,
    reporter: Reporter,
    *,
    house: Path,
    keep: bool,
    previous: Lock | None,
) -> tuple[list[LockedPackage], list[BuiltWheel]]:
    """The locked wheels of the resolved source distributions: the previous lock's, when it built the same sdist
    and the wheelhouse still has that wheel; else built now, into ``house`` when ``keep`` (not a dry run)."""
    pins: list[LockedPackage] = []
    built: list[BuiltWheel] = []
    todo: list[tuple[LockedPackage, BuiltWheel | None]] = []
    for s in sdists:
        prev = previous.built_from(s.name) if previous is not None else None
        same = prev if prev is not None and (prev.version, prev.sdist_sha256) == (s.version, s.hashes[0]) else None
        pin = previous.get(s.name) if previous is not None and same is not None else None
        if same is not None and pin is not None and find_wheel(house, pin) is not None:
            pins.append(pin)
            built.append(same)
        else:
            todo.append((s, same))
    if todo:
        names = ", ".join(f"{s.name} {s.version}" for s, _ in todo)
        reporter.step(f"building {len(todo)} wheel(s) from source distributions, which no wheel replaces: {names}")
    with tempfile.TemporaryDirectory(prefix="nodekit-built-") as tmp:
        made = []
        for s, same in todo:
            wheel, record = builder.build(s.name, s.version, s.hashes[0], Path(tmp), same.backend if same else None)
            pins.append(LockedPackage(name=s.name, version=s.version, hashes=(file_sha256(wheel),)))
            built.append(record)
            made.append(wheel)
        if keep:  # only once every build has succeeded: a refused lock leaves nothing behind
            house.mkdir(parents=True, exist_ok=True)
            for wheel in made:
                shutil.move(wheel, house / wheel.name)
    return pins, built


def _first_resolution(
    inputs: Sequence[str], constraints: list[str], kw: Mapping[str, Any], reporter: Reporter
) -> tuple[dict[str, Any], bool]:
    try:
        try:
            return run_report(inputs, constraints, **kw), True
        except pipcmd.ResolveFailed:
            if not constraints:
                raise
            reporter.warn("the previous pins conflict with the new requirements; resolving without them")
            return run_report(inputs, [], **kw), False
    except pipcmd.ResolveFailed as e:
        raise ConfigError(
            f"cannot resolve packages for Python {kw['python_version']} on {kw['platform']}: {pipcmd.redact(str(e))}",
            fix="change packages in nodekit.toml (each needs a wheel for the image's Python and platform, or a "
            "pure-Python source distribution)",
        ) from None


def resolve(
    settings: Settings,
    reporter: Reporter,
    tgt: WheelTarget,
    *,
    previous: Lock | None = None,
    upgrade: bool = False,
    keep_built: bool = True,
) -> tuple[Lock, bool]:
    """Resolve the config's packages for the image ``tgt``; returns the lock and whether previous pins were all
    kept.

    ``tgt`` gives the Python, platform and what the base already installs: those versions are constraints, and
    the lock leaves them out (``# provided:``). A requirement the base's version contradicts is a ConfigError
    naming both. With ``previous`` (and not ``upgrade``) the pins of packages whose input requirement did not
    change are passed as constraints, so unrelated packages stay where they were; when that cannot be satisfied
    the resolution is retried without them. A top-level requirement below its newest release is settled by
    :func:`nodekit.image.lock.newest.settle`; source distributions in the result are built into wheels
    (:mod:`nodekit.image.lock.sdist`), kept in the wheelhouse when ``keep_built``.
    """
    inputs = normalize_inputs(settings.packages)
    pv, platform = tgt.python_version, tgt.wheel_platform
    provided = tgt.stack.provided() if tgt.stack is not None else {}
    full = tgt.stack.version if tgt.stack is not None and tgt.stack.python_version == pv else None
    env = target_environment(pv, platform, full)
    clash = base_conflicts(inputs, provided, env)
    if clash:
        more = f" (and {len(clash) - 1} more)" if len(clash) > 1 else ""
        raise ConfigError(
            f"packages ask for {clash[0]}{more}: nodekit keeps what base {settings.base_image} provides",
            fix="drop or relax that requirement in nodekit.toml, or choose a base_image with the version you need",
        )
    constraints: list[str] = []
    if previous is not None and not upgrade and (previous.python_version, previous.platform) == (pv, platform):
        changed = {canonicalize_name(Requirement(r).name) for r in set(inputs) - set(previous.inputs)}
        constraints = [f"{p.name}=={p.version}" for p in previous.packages if p.name not in changed]
    reporter.step(f"resolving {len(inputs)} requirement(s) for Python {pv} on {platform}")
    src = pipcmd.sources(settings)
    kw: dict[str, Any] = {"python_version": pv, "platform": platform, "sources": src, "full_version": full}
    report, kept = _first_resolution(inputs, constraints, {**kw, "provided": provided}, reporter)
    where = f"Python {pv} on {platform}"
    newest = newest_versions(checked(inputs, env, provided), **kw)
    used = constraints if kept else []

    def rerun(requirements: Sequence[str]) -> dict[str, Any]:
        return run_report(requirements, used, **kw, provided=provided)

    held = {c.split("==")[0] for c in used}
    report = settle(report, inputs, newest, held=held, rerun=rerun, reporter=reporter, where=where)
    wheels, sdists = read_report(report, provided)
    heavy = cuda.check(report, [p.name for p in (*wheels, *sdists)])
    if heavy is not None:
        reporter.warn(heavy)  # before the build downloads any of it
    from_source, built = build_sdists(
        sdists,
        Builder(src, where),
        reporter,
        house=wheelhouse_dir(settings),
        keep=keep_built,
        previous=None if upgrade else previous,
    )
    kept_from_base = tuple(sorted(f"{n}=={v}" for n, v in versions(report).items() if provided.get(n) == v))
    lock = Lock(
        python_version=pv,
        platform=platform,
        inputs=inputs,
        packages=(*wheels, *from_source),
        provided=kept_from_base,
        built=tuple(built),
    )
    return lock, kept
