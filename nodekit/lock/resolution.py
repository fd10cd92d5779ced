"""Resolution: the config's packages -> pins for the image's Python and platform, from pip's dry-run report.

What the base image already installs is passed as constraints (with metadata-only stand-in wheels, so versions no
index carries resolve) and left out of the pins. Re-locking passes the previous pins as constraints, so changing one
package moves only that package unless the new requirement forces its dependencies to move.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from nodekit.errors import ConfigError
from nodekit.lock import pip as pipcmd
from nodekit.lock.format import Lock, LockedPackage, normalize_inputs, target_environment
from nodekit.progress import Reporter
from nodekit.settings import Settings

if TYPE_CHECKING:
    from nodekit.probe import Target


class ResolveFailed(Exception):
    """pip could not resolve; the message is pip's own line."""


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


def packages_from_report(
    report: Mapping[str, Any], provided: Mapping[str, str] | None = None
) -> tuple[LockedPackage, ...]:
    """Pins from pip's installation report (format version 1), leaving out what the base ``provided`` at the
    resolved version (name -> version)."""
    pins = []
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
                "(not an index's wheel?)",
                fix="require a package available as a wheel from your index or find-links",
            )
        pins.append(LockedPackage(name=name, version=version, hashes=(hashes["sha256"],)))
    return tuple(sorted(pins, key=lambda p: p.name))


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
        (d / "requirements.txt").write_text("\n".join(requirements) + "\n")
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
        argv = pipcmd.resolve_argv(
            sys.executable,
            d / "requirements.txt",
            d / "report.json",
            d / "target",
            cons,
            python_version=python_version,
            platform=platform,
            sources=extra,
            full_version=full_version,
        )
        proc = pipcmd.run(argv, what="pip resolving the lock", fix=pipcmd.FIX_ACCESS)
        if proc.returncode != 0:
            raise ResolveFailed(pipcmd.pip_error(proc.stderr))
        report: dict[str, Any] = json.loads((d / "report.json").read_text())
    return report


def sources(settings: Settings) -> list[str]:
    return pipcmd.source_options(settings.index_url, settings.extra_index_urls, settings.find_links)


def resolve(
    settings: Settings,
    reporter: Reporter,
    tgt: Target,
    *,
    previous: Lock | None = None,
    upgrade: bool = False,
) -> tuple[Lock, bool]:
    """Resolve the config's packages for the image ``tgt``; returns the lock and whether previous pins were all
    kept.

    ``tgt`` gives the Python, platform and what the base already installs: those versions are constraints, and
    the lock leaves them out (``# provided:``). A requirement the base's version contradicts is a ConfigError
    naming both. With ``previous`` (and not ``upgrade``) the pins of packages whose input requirement did not
    change are passed as constraints, so unrelated packages stay where they were; when that cannot be satisfied
    the resolution is retried without them.
    """
    inputs = normalize_inputs(settings.packages)
    pv, platform = tgt.python_version, tgt.wheel_platform
    provided = tgt.stack.provided() if tgt.stack is not None else {}
    full = tgt.stack.version if tgt.stack is not None and tgt.stack.python_version == pv else None
    clash = base_conflicts(inputs, provided, target_environment(pv, platform, full))
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
    kw: dict[str, Any] = {
        "python_version": pv,
        "platform": platform,
        "sources": sources(settings),
        "provided": provided,
        "full_version": full,
    }
    kept = True
    try:
        try:
            report = run_report(inputs, constraints, **kw)
        except ResolveFailed:
            if not constraints:
                raise
            kept = False
            reporter.warn("the previous pins conflict with the new requirements; resolving without them")
            report = run_report(inputs, [], **kw)
    except ResolveFailed as e:
        raise ConfigError(
            f"cannot resolve packages for Python {pv} on {platform}: {pipcmd.redact(str(e))}",
            fix="change packages in nodekit.toml (each needs a wheel for the image's Python and platform)",
        ) from None
    used = {canonicalize_name(i["metadata"]["name"]): str(i["metadata"]["version"]) for i in report.get("install", [])}
    kept_from_base = tuple(sorted(f"{n}=={v}" for n, v in used.items() if provided.get(n) == v))
    lock = Lock(
        python_version=pv,
        platform=platform,
        inputs=inputs,
        packages=packages_from_report(report, provided),
        provided=kept_from_base,
    )
    return lock, kept
