"""Wheels built on the host from pure-Python source distributions, reproducibly.

Some real dependency trees reach a release published only as a source distribution (hydra-core needs
``antlr4-python3-runtime==4.9.*``). The image installs offline from wheels with ``--require-hashes``, so nodekit
builds such a wheel here, once, and locks its hash. The build is fixed so that another host rebuilds the same
bytes from the lock alone: the sdist is pinned by its sha256, the isolated build environment by the versions
its backend resolved to when the lock was made (pip constraints), and the rest by ``SOURCE_DATE_EPOCH``,
``PYTHONHASHSEED`` and the umask (file modes are stored in the wheel). A wheel is kept only if it is pure Python
(``py3-none-any``): anything else was compiled for this host, not the image, and is refused with the fix.
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from nodekit.errors import ConfigError
from nodekit.image.lock import pip as pipcmd
from nodekit.image.lock.format import BuiltWheel

# Fixed forever: changing any of these changes the bytes, so the hash, of every wheel already locked.
BUILD_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can hold
BUILD_UMASK = 0o022
# What pip assumes for a source distribution without [build-system] (PEP 518).
DEFAULT_REQUIRES = ("setuptools>=40.8.0",)
PURE_TAGS = frozenset({"py3-none-any", "py2-none-any"})


def is_pure(wheel_name: str) -> bool:
    """The wheel runs on any Python 3 and platform: tagged py3-none-any (or py2.py3-none-any)."""
    tags = {str(t) for t in parse_wheel_filename(wheel_name)[3]}
    return "py3-none-any" in tags and tags <= PURE_TAGS


def build_requires(sdist: Path) -> list[str]:
    """``[build-system] requires`` of a source distribution's pyproject.toml (pip's default without one)."""
    text = None
    if sdist.name.endswith(".zip"):
        with zipfile.ZipFile(sdist) as z:
            names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith("/pyproject.toml")]
            text = z.read(names[0]).decode() if names else None
    else:
        with tarfile.open(sdist) as t:
            members = [m for m in t.getmembers() if m.isfile() and m.name.count("/") == 1]
            member = next((m for m in members if m.name.endswith("/pyproject.toml")), None)
            f = t.extractfile(member) if member is not None else None
            text = f.read().decode() if f is not None else None
    try:
        system = tomllib.loads(text).get("build-system", {}) if text else {}
    except tomllib.TOMLDecodeError:
        system = {}
    requires = system.get("requires") if isinstance(system, dict) else None
    if not isinstance(requires, list):
        return list(DEFAULT_REQUIRES)
    return [str(r) for r in requires]


class Builder:
    """Builds locked wheels from source distributions with the project's package sources.

    ``where`` describes the image ("Python 3.11 on manylinux_2_36_x86_64") for the messages.
    """

    def __init__(self, sources: Sequence[str], where: str) -> None:
        self.sources = list(sources)
        self.where = where

    def build(
        self, name: str, version: str, sdist_sha256: str, dest: Path, backend: Sequence[str] | None = None
    ) -> tuple[Path, BuiltWheel]:
        """The pure wheel of ``name==version`` built from the sdist with ``sdist_sha256``, placed in ``dest``.

        ``backend`` (``name==version`` pins of the build environment) is resolved afresh when None, as when the
        lock is made; a rebuild passes the lock's. Raises ConfigError naming the package when the build fails or
        gives a compiled wheel.
        """
        with tempfile.TemporaryDirectory(prefix="nodekit-sdist-") as tmp:
            d = Path(tmp)
            sdist = self._download(name, version, sdist_sha256, d / "sdist")
            pins = tuple(backend) if backend is not None else self._backend(build_requires(sdist), d)
            wheel = self._wheel(name, version, sdist, pins, d)
            if not is_pure(wheel.name):
                raise ConfigError(
                    f"{name} {version} has no wheel for {self.where}, and its source distribution builds a "
                    f"compiled wheel ({wheel.name}) for this host, not for the image",
                    fix=self._fix(name),
                )
            dest.mkdir(parents=True, exist_ok=True)
            final = dest / wheel.name
            wheel.replace(final)
        return final, BuiltWheel(name=name, version=version, sdist_sha256=sdist_sha256, backend=pins)

    def _fix(self, name: str) -> str:
        return (
            f"pin a {name} version that has a wheel for {self.where} in nodekit.toml, or install {name} in the "
            "base image (nodekit builds only pure-Python source distributions)"
        )

    def _download(self, name: str, version: str, sha256: str, dest: Path) -> Path:
        req = dest.parent / "sdist.txt"
        req.write_text(f"{name}=={version} --hash=sha256:{sha256}\n")
        argv = pipcmd.sdist_download_argv(sys.executable, name, req, dest, self.sources)
        proc = pipcmd.run(argv, what=f"pip downloading the source of {name} {version}", fix=pipcmd.FIX_ACCESS)
        found = sorted(dest.glob("*")) if dest.is_dir() else []
        if proc.returncode != 0 or len(found) != 1:
            raise ConfigError(
                f"cannot fetch the source distribution of {name} {version}: "
                f"{pipcmd.redact(pipcmd.pip_error(proc.stderr))}",
                fix=pipcmd.FIX_ACCESS,
            )
        return found[0]

    def _backend(self, requires: Sequence[str], d: Path) -> tuple[str, ...]:
        """The build environment's pins: ``requires`` resolved for the host, plus ``wheel`` for a setuptools
        older than 70.1 (it needs that package to write wheels and does not declare it)."""
        pins = self._resolve_host(requires, d)
        setuptools = next((p.split("==")[1] for p in pins if p.startswith("setuptools==")), None)
        if (
            setuptools is not None
            and Version(setuptools) < Version("70.1")
            and not any(p.startswith("wheel==") for p in pins)
        ):
            pins = self._resolve_host([*requires, "wheel"], d)
        return pins

    def _resolve_host(self, requires: Sequence[str], d: Path) -> tuple[str, ...]:
        for r in requires:
            try:
                Requirement(r)
            except InvalidRequirement:
                raise ConfigError(f"a build requirement {r!r} is not a valid requirement", fix="report it") from None
        if not requires:
            return ()
        report = d / "backend.json"
        argv = pipcmd.backend_argv(sys.executable, requires, report, self.sources)
        proc = pipcmd.run(argv, what="pip resolving a build backend", fix=pipcmd.FIX_ACCESS)
        if proc.returncode != 0:
            why = pipcmd.redact(pipcmd.pip_error(proc.stderr))
            raise ConfigError(f"cannot resolve the build backend {', '.join(requires)}: {why}", fix=pipcmd.FIX_ACCESS)
        items = json.loads(report.read_text()).get("install", [])
        return tuple(sorted(f"{canonicalize_name(i['metadata']['name'])}=={i['metadata']['version']}" for i in items))

    def _wheel(self, name: str, version: str, sdist: Path, pins: Sequence[str], d: Path) -> Path:
        constraints = d / "backend.txt"
        constraints.write_text("".join(f"{p}\n" for p in pins))
        env = {
            "SOURCE_DATE_EPOCH": str(BUILD_EPOCH),
            "PYTHONHASHSEED": "0",
            # pip < 25.3 constrains the isolated build environment with PIP_CONSTRAINT, later ones with this one.
            "PIP_CONSTRAINT": str(constraints),
            "PIP_BUILD_CONSTRAINT": str(constraints),
        }
        out = d / "wheel"
        argv = pipcmd.wheel_argv(sys.executable, sdist, out, self.sources, env=env, umask=BUILD_UMASK)
        proc = pipcmd.run(argv, what=f"pip building {name} {version} from source", fix=self._fix(name))
        wheels = sorted(out.glob("*.whl")) if out.is_dir() else []
        if proc.returncode != 0 or len(wheels) != 1:
            raise ConfigError(
                f"{name} {version} has no wheel for {self.where}, and building its source distribution on this "
                f"host failed: {pipcmd.redact(pipcmd.pip_error(proc.stderr))}",
                fix=self._fix(name),
            )
        return wheels[0]
