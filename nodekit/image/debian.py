"""``nodekit base``: a minimal Debian base image with Python from Debian packages, made without any registry.

mmdebstrap builds the root file system from the Debian mirror the host already uses (``--variant=minbase`` plus
python3 and python3-venv; documentation, manual pages and locales left out) as a tarball. With
SOURCE_DATE_EPOCH that tarball is bit-for-bit reproducible for a given mirror state. ``docker import`` would
stamp the image with the current time, so nodekit writes a ``docker load`` archive itself (config ``created`` =
SOURCE_DATE_EPOCH, one layer = the tarball): the same mirror state gives the same image id on every machine, and
with it the same stack fingerprints. :func:`plan_base` decides everything (pure); :func:`create_base` carries
it out.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image.archive import Image, archive, layer_descriptor
from nodekit.image.plan import SOURCE_DATE_EPOCH
from nodekit.launcher.datacheck.filehash import file_sha256
from nodekit.system import docker, proc
from nodekit.system.frozen import FROZEN
from nodekit.system.progress import Reporter

DEFAULT_TAG = "nodekit/base:bookworm"
DEFAULT_SUITE = "bookworm"
OWN_REPOSITORY = "nodekit/base"
# Debian suites nodekit knows how to bootstrap, with the Python each ships (trixie: 3.13, so the probe and the
# resolver are exercised against a second real Python).
SUITES = ("bookworm", "trixie")
APT_TIMEOUT_S = 900.0
# mmdebstrap downloads and unpacks a whole Debian root; minutes normally, an hour means a stalled mirror.
MMDEBSTRAP_TIMEOUT_S = 3600.0
PACKAGES = ("python3", "python3-venv")
# dpkg never unpacks these, in the base and in anything later installed on top of it (the options stay in
# /etc/dpkg/dpkg.cfg.d). Copyright files stay: they are the licence notices.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
)
# Caches and logs of the bootstrap itself have no use in an image.
CLEANUP_HOOK = 'rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache'


class BasePlan(BaseModel):
    """How the base image is made: the mmdebstrap command line, and the image config around its tarball."""

    model_config = FROZEN

    tag: str
    suite: str
    packages: tuple[str, ...]
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    source_date_epoch: int
    architecture: str
    image_env: tuple[str, ...]
    cmd: tuple[str, ...]

    def describe(self) -> str:
        return "\n".join(
            [
                f"base image  {self.tag} ({self.architecture})",
                f"debian      {self.suite} (minbase) + {', '.join(self.packages)}",
                f"command     {' '.join(self.argv)}",
                *(f"env         {k}={v}" for k, v in self.env),
                f"image       created {self.source_date_epoch} (SOURCE_DATE_EPOCH), env {list(self.image_env)}, "
                f"cmd {list(self.cmd)}; loaded with docker load",
            ]
        )


def docker_arch(machine: str) -> str:
    """Docker's name for a ``platform.machine()`` value."""
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}.get(
        machine, machine
    )


def plan_base(
    tag: str = DEFAULT_TAG,
    *,
    output: Path,
    suite: str = DEFAULT_SUITE,
    packages: tuple[str, ...] = PACKAGES,
    mirror: str | None = None,
    source_date_epoch: int = SOURCE_DATE_EPOCH,
    architecture: str = "amd64",
) -> BasePlan:
    """The mmdebstrap run writing the root file system of ``tag`` to ``output`` (a .tar), and the image around it.

    mmdebstrap runs for the host's architecture; pass it as ``architecture`` (Docker's spelling).
    """
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        *(f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES),
        f"--customize-hook={CLEANUP_HOOK}",
        suite,
        str(output),
    ]
    if mirror:
        argv.append(mirror)
    return BasePlan(
        tag=tag,
        suite=suite,
        packages=packages,
        argv=tuple(argv),
        env=(("SOURCE_DATE_EPOCH", str(source_date_epoch)),),
        source_date_epoch=source_date_epoch,
        architecture=architecture,
        image_env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
        cmd=("/bin/bash",),
    )


def image_config(plan: BasePlan, layer_sha256: str) -> bytes:
    """The image config's exact bytes; the image id is their sha256 (a pure function of the plan and layer)."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(plan.source_date_epoch))
    config = {
        "architecture": plan.architecture,
        "os": "linux",
        "created": created,
        "config": {"Env": list(plan.image_env), "Cmd": list(plan.cmd)},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_sha256}"]},
        "history": [{"created": created, "created_by": "mmdebstrap"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def write_load_archive(plan: BasePlan, rootfs: Path, out: Path) -> Image:
    """Write a ``docker load`` archive of ``rootfs`` as ``plan.tag`` to ``out`` (:mod:`nodekit.image.archive`: it
    loads on both image stores, the layer uncompressed, so a containerd-store engine holds it under its diff id as a
    classic one does); returns the image, whose ``id_on`` says the id each store gives it."""
    digest = "sha256:" + file_sha256(rootfs)
    image = Image(config=image_config(plan, digest.removeprefix("sha256:")),
                  layers=(layer_descriptor(digest, rootfs.stat().st_size),))  # fmt: skip
    with out.open("wb") as f:
        for chunk in archive(image, plan.tag, {digest: rootfs}):
            f.write(chunk)
    return image


def own_suite(tag: str) -> str | None:
    """The Debian suite of ``tag`` when it names nodekit's own base (``nodekit/base:<suite>``), else None."""
    repo, sep, suite = tag.rpartition(":")
    return suite if sep and repo == OWN_REPOSITORY and suite in SUITES else None


def choose_base(base_image: str, suite: str | None, *, present: bool) -> tuple[str, str]:
    """Pure: the (tag, suite) ``nodekit base`` makes; it only ever names its own image, ``nodekit/base:<suite>``.

    ``suite`` given: that suite's base, whatever ``base_image`` says. Otherwise ``base_image`` must name one of
    nodekit's own bases; anything else (``nvidia/cuda:...``) is an ImageError, so a missing vendor image never
    becomes plain Debian under the vendor's name. ``present``: whether ``base_image`` is in the engine (wording).
    """
    if suite is not None:
        if suite not in SUITES:
            raise ImageError(
                f"nodekit base knows Debian suites {', '.join(SUITES)}, not {suite!r}",
                fix=f"nodekit base --suite {DEFAULT_SUITE}",
            )
        return f"{OWN_REPOSITORY}:{suite}", suite
    own = own_suite(base_image)
    if own is not None:
        return base_image, own
    what = "is not nodekit's own base" if present else "is not in the local Docker engine"
    raise ImageError(
        f"base image {base_image} {what}, and nodekit base makes only {OWN_REPOSITORY}:<suite> "
        f"(it never tags Debian under another image's name)",
        fix=f'docker load {base_image} on this machine, or set base_image = "{DEFAULT_TAG}" and run nodekit base',
    )


def missing_base(settings: Settings) -> bool:
    """The configured base image is not in the local engine (``nodekit build`` would refuse)."""
    return docker.image_info(settings.base_image) is None


class BaseResult(BaseModel):
    model_config = FROZEN

    tag: str
    image_id: str
    size: int
    seconds: float
    created: bool


def _ensure_mmdebstrap(reporter: Reporter) -> None:
    if shutil.which("mmdebstrap"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageError(
            "mmdebstrap is not installed (it builds the Debian root file system)",
            fix="sudo apt-get install -y mmdebstrap, then nodekit base",
        )
    reporter.step("installing mmdebstrap with apt-get")
    done = proc.run(
        ["apt-get", "install", "-y", "--no-install-recommends", "mmdebstrap"],
        deadline=APT_TIMEOUT_S,
        what="apt-get install mmdebstrap",
        fix="check that the host reaches its Debian mirror (apt-get update), then nodekit base",
        env=proc.environ({"DEBIAN_FRONTEND": "noninteractive"}),
    )
    if done.returncode != 0 or not shutil.which("mmdebstrap"):
        last = (done.stderr.strip().splitlines() or ["apt-get failed"])[-1]
        raise ImageError(f"cannot install mmdebstrap: {last}", fix="apt-get update && apt-get install -y mmdebstrap")


def _run(argv: tuple[str, ...], env: Mapping[str, str], reporter: Reporter) -> None:
    fix = "check that the host reaches its Debian mirror (apt-get update), then nodekit base"
    child = proc.start(argv, deadline=MMDEBSTRAP_TIMEOUT_S, what="mmdebstrap", fix=fix, env=proc.environ(env),
                       stdout="pipe", stderr="stdout")  # fmt: skip
    tail: list[str] = []
    for line in child.lines():
        tail = [*tail[-19:], line.rstrip()]
        reporter.detail(line.rstrip())
    code = child.wait()
    child.check()
    if code != 0:
        errors = [ln for ln in tail if "E:" in ln or "error" in ln.lower()]
        raise ImageError(
            f"mmdebstrap failed: {(errors or tail or ['no output'])[-1].strip()}",
            fix="check that the host reaches its Debian mirror (apt-get update), then nodekit base",
        )


def create_base(
    tag: str = DEFAULT_TAG,
    reporter: Reporter | None = None,
    *,
    dry_run: bool = False,
    if_missing: bool = False,
    mirror: str | None = None,
) -> BaseResult | BasePlan:
    """Create nodekit's base image ``tag`` (``nodekit/base:<suite>``, see :func:`choose_base`); returns the plan
    with ``dry_run``, else what was made (or found).

    With ``if_missing`` an existing ``tag`` is kept. Needs root (mmdebstrap, and apt-get to install it when
    absent) and the host's Debian mirror; raises ImageError saying which is missing, or when ``tag`` is not
    nodekit's own base name.
    """
    from nodekit.system.progress import NullReporter

    suite = own_suite(tag)
    if suite is None:
        # Never tag Debian under another image's name; choose_base raises, saying whether the image is here.
        choose_base(tag, None, present=not dry_run and docker.image_info(tag) is not None)
        raise AssertionError("unreachable")
    rep: Reporter = reporter or NullReporter()
    with tempfile.TemporaryDirectory(prefix="nodekit-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        plan = plan_base(tag, output=rootfs, suite=suite, mirror=mirror, architecture=docker_arch(platform.machine()))
        if dry_run:
            rep.done(plan.describe())
            return plan
        docker.check_engine()
        if if_missing and (have := docker.image_info(tag)) is not None:
            rep.done(f"base image {tag} is already here")
            return BaseResult(tag=tag, image_id=have.id, size=have.size, seconds=0.0, created=False)
        t0 = time.monotonic()
        _ensure_mmdebstrap(rep)
        rep.step(f"bootstrapping Debian {plan.suite} (minbase + {', '.join(plan.packages)})")
        _run(plan.argv, dict(plan.env), rep)
        rep.step(f"loading it as {tag}")
        archive_path = Path(tmp) / "image.tar"
        image = write_load_archive(plan, rootfs, archive_path)
        docker.load_archive(archive_path)
        info = docker.require_image(tag)
        expected = image.id_on(docker.engine_facts(None).containerd_store)
        if info.id != expected:
            raise ImageError(f"docker loaded {tag} as {info.id}, expected {expected}", fix="nodekit base")
    seconds = round(time.monotonic() - t0, 1)
    rep.done(f"created {tag} ({info.size / 1e6:.0f} MB, {info.id[:19]}) in {seconds:.0f} s")
    return BaseResult(tag=tag, image_id=info.id, size=info.size, seconds=seconds, created=True)
