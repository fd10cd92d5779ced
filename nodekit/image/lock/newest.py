"""No top-level requirement resolves silently below its newest release for the image.

pip backtracks without a word: when the newest ``lightly-train`` needed a dependency that it could not take, it
settled on the empty placeholder release 0.0.0. After resolving, nodekit asks pip for the newest release of each
top-level requirement that the image can take (its own specifier applies; no dependencies), and where the
resolution is below it, resolves again with that release pinned. When that works without moving another
top-level requirement down, the lock takes it (pip had merely preferred an older wheel to a source distribution,
or explored in another order); otherwise the lock fails, naming both versions and pip's reason, unless the user
pins the older version. A requirement held at its previous lock's pin is only reported (``--upgrade`` moves it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from nodekit.errors import ConfigError
from nodekit.image.lock import pip as pipcmd
from nodekit.system.progress import Reporter

PipReport = dict[str, Any]
"""The JSON that `pip install --report` writes (a resolution), as parsed."""


class Behind(NamedTuple):
    """A top-level requirement resolved to ``have`` while ``newest`` is the newest release the image can take."""

    name: str
    have: str
    newest: str


def checked(inputs: Sequence[str], env: Mapping[str, str], provided: Collection[str]) -> list[str]:
    """The top-level requirements to check: those that apply to the image, name an index's package that the base
    does not provide, and are not pinned to one version (a pin is the user's own choice)."""
    out = []
    for text in inputs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(dict(env)):
            continue
        if req.url or canonicalize_name(req.name) in provided:
            continue
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and not specs[0].version.endswith("*"):
            continue
        out.append(text)
    return out


def versions(report: Mapping[str, Any]) -> dict[str, str]:
    """name -> version of every distribution in pip's installation report."""
    return {canonicalize_name(i["metadata"]["name"]): str(i["metadata"]["version"]) for i in report.get("install", [])}


def lagging(newest: Mapping[str, str], have: Mapping[str, str]) -> list[Behind]:
    """Pure: the requirements resolved below their newest release, by name."""
    return [Behind(n, have[n], v) for n, v in sorted(newest.items()) if n in have and Version(have[n]) < Version(v)]


def with_pins(inputs: Sequence[str], pins: Mapping[str, str]) -> list[str]:
    """Pure: ``inputs`` with the requirements named in ``pins`` (name -> version) pinned, extras and markers kept."""
    out = []
    for text in inputs:
        req = Requirement(text)
        version = pins.get(canonicalize_name(req.name))
        if version is not None:
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            text = f"{req.name}{extras}=={version}" + (f"; {req.marker}" if req.marker else "")
        out.append(text)
    return out


def newest_versions(
    requirements: Sequence[str], *, python_version: str, platform: str, sources: Sequence[str], full_version: str | None
) -> dict[str, str]:
    """The newest release of each requirement the image can take (a wheel for it, or a source distribution)."""
    if not requirements:
        return {}

    def failed(proc: pipcmd.Finished) -> ConfigError:
        return ConfigError(
            f"cannot find the newest release of {', '.join(requirements)} for Python {python_version} on "
            f"{platform}: {pipcmd.redact(pipcmd.pip_error(proc.stderr))}",
            fix="change packages in nodekit.toml",
        )

    with tempfile.TemporaryDirectory(prefix="nodekit-newest-") as tmp:
        report = pipcmd.dry_run_report(
            Path(tmp), requirements, pipcmd.newest_argv, what="pip finding the newest releases", failed=failed,
            python_version=python_version, platform=platform, sources=sources, full_version=full_version,
        )  # fmt: skip
    return versions(report)


def settle(
    report: PipReport,
    inputs: Sequence[str],
    newest: Mapping[str, str],
    *,
    held: Collection[str],
    rerun: Callable[[Sequence[str]], PipReport],
    reporter: Reporter,
    where: str,
) -> PipReport:
    """The resolution with every checked requirement at its newest release, or a ConfigError saying why not.

    ``rerun`` resolves other inputs the same way (it raises pipcmd.ResolveFailed); ``held`` are the names the
    previous lock's pins kept, which are reported, not failed.
    """
    for b in lagging(newest, versions(report)):
        if b.name in held:
            reporter.warn(
                f"{b.name} stays at {b.have} as the previous lock had it; its newest release for {where} is "
                f"{b.newest} (nodekit lock --upgrade moves it)"
            )
    newest = {n: v for n, v in newest.items() if n not in held}
    pins: dict[str, str] = {}
    for _ in range(len(newest)):
        have = versions(report)
        behind = lagging(newest, have)
        if not behind:
            break
        b = behind[0]
        try:
            trial = rerun(with_pins(inputs, {**pins, b.name: b.newest}))
        except pipcmd.ResolveFailed as e:
            raise _behind_error(b, pipcmd.redact(pipcmd.conflict_reason(e.output)), behind[1:], where) from None
        moved = [f"{n} {have[n]} -> {v}" for n, v in versions(trial).items() if n in newest and _lower(v, have.get(n))]
        if moved:
            reason = f"with {b.name}=={b.newest}, pip would move {', '.join(moved)}"
            raise _behind_error(b, reason, behind[1:], where)
        reporter.step(f"{b.name}: pip first settled on {b.have}; {b.newest} resolves too and is locked")
        pins[b.name] = b.newest
        report = trial
    return report


def _lower(version: str, than: str | None) -> bool:
    return than is not None and Version(version) < Version(than)


def _behind_error(b: Behind, reason: str, others: Sequence[Behind], where: str) -> ConfigError:
    more = "; also below their newest: " + ", ".join(f"{o.name} {o.have} < {o.newest}" for o in others)
    return ConfigError(
        f"{b.name} would resolve to {b.have}, below its newest release for {where}, {b.newest}: "
        f"{reason}{more if others else ''}",
        fix=f"pin {b.name}=={b.have} in nodekit.toml to accept it, or change the requirement that holds it back",
    )
