"""Pure: the image build plan, its labels and build arguments.

Nothing here touches Docker, the file system or the process environment. Callers gather the facts (the base
image id, the lock text, the Dockerfile text, file trees as :class:`TreeEntry` tuples) and pass them in, so the
same inputs give the same fingerprint on any machine, and tests compare plans to expected values.

Its parts, each pure as well: :mod:`~nodekit.image.dockerignore` (Docker's ``.dockerignore`` rules),
:mod:`~nodekit.image.fingerprint` (the stack fingerprint and tag), :mod:`~nodekit.image.locklayers` (the lock's
three package layers). Their names are re-exported here, where callers import them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from nodekit.image.dockerignore import DEFAULT_EXCLUDES, IgnoreRules, ignore_rules, parse_dockerignore
from nodekit.image.fingerprint import (
    FINGERPRINT_SCHEME,
    TAG_LENGTH,
    StackInputs,
    TreeEntry,
    fingerprint,
    image_tag,
    normal_mode,
    sha256_text,
)
from nodekit.image.locklayers import CUDA_LIBS_PACKAGE, FRAMEWORK_PACKAGE, LockLayers, split_lock
from nodekit.launcher.contract import WORKDIR, Env, Label
from nodekit.system.frozen import FROZEN

LABEL_NAME = Label.NAME
LABEL_FINGERPRINT = Label.FINGERPRINT
LABEL_LOCK = Label.LOCK
LABEL_TORCH = Label.TORCH
LABEL_PYTHON = Label.PYTHON
LABEL_BASE = Label.BASE
LABEL_BASE_ID = Label.BASE_ID
LABEL_VERSION = Label.VERSION

# Staging layout under <project>/.nodekit/build/: what is hashed is exactly what is sent to BuildKit. The code,
# launcher and Dockerfile go to a directory named by the fingerprint: their mtimes are clamped to
# SOURCE_DATE_EPOCH (reproducible layers), and BuildKit's incremental context transfer compares mtimes and sizes,
# so a reused path could keep a stale copy of a same-size edit. The wheels keep one path: their names and hashes
# change together.
STAGE_LAUNCHER = "launcher"  # the main build context: nodekit/__init__.py + nodekit/launcher/
STAGE_CODE = "code"  # --build-context code=...: the project after .dockerignore
STAGE_WHEELS = "wheels"  # --build-context wheels=...: the locked wheels + nodekit.lock, bind-mounted
STAGE_FRAMEWORK = "framework"  # --build-context framework=...: the framework's wheels + framework.lock
STAGE_CUDA_LIBS = "cudalibs"  # --build-context cudalibs=...: the CUDA libraries' wheels + cudalibs.lock
FRAMEWORK_LOCK = "framework.lock"  # in STAGE_FRAMEWORK: the lock's framework lines (its own layer)
CUDA_LIBS_LOCK = "cudalibs.lock"  # in STAGE_CUDA_LIBS: the lock's CUDA library lines (the layer below it)
PACKAGES_LOCK = "packages.lock"  # in STAGE_WHEELS: the other lines (the packages layer above it)
STAGE_DOCKERFILE = "Dockerfile"
# Every timestamp the image carries (config, history, file mtimes) is this instant, 2025-01-01T00:00:00Z, so two
# builds of the same inputs give the same image id. `docker images` therefore shows the same "created" for all.
SOURCE_DATE_EPOCH = 1735689600

# What images/Dockerfile's ENV, WORKDIR and ENTRYPOINT lines give every image (nodekit writes the config itself:
# nodekit/image/layers.py; tests/unit hold the Dockerfile to these). ${PATH} is the base's PATH.
IMAGE_ENV = {
    "VIRTUAL_ENV": "/opt/venv",
    "PATH": "/opt/venv/bin:${PATH}",
    "PYTHONPATH": "/opt/nodekit",
    "PYTHONUNBUFFERED": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
}
ENTRYPOINT = ("/opt/venv/bin/python", "-m", "nodekit.launcher")


class PackageLayer(BaseModel):
    """One of the image's package layers: its name, the Dockerfile stage that exports its files, what it holds."""

    model_config = FROZEN

    name: str
    target: str
    what: str
    lock: str
    """The requirement file its packages are installed from (in its build context)."""

    @property
    def created_by(self) -> str:
        """Its row in the image's history (``docker history``)."""
        return f"RUN pip install --require-hashes -r /wheels/{self.lock} (the {self.what} layer)"


PACKAGE_LAYERS = (
    PackageLayer(name="env", target="layer-env", what="Python environment and CUDA libraries", lock=CUDA_LIBS_LOCK),
    PackageLayer(name="framework", target="layer-framework", what="framework", lock=FRAMEWORK_LOCK),
    PackageLayer(name="packages", target="layer-packages", what="packages", lock=PACKAGES_LOCK),
)
LAYER_SCHEME = "nodekit-layer-v1"
"""Bump when the way a package layer is made changes (the Dockerfile's stages are an input already): a layer kept
under an old key must not be reused."""

# Arguments the Dockerfile declares after the last filesystem step: metadata only, so they never invalidate a
# layer, and they are not fingerprint inputs (they are derived from the inputs, the fingerprint among them).
# Each is the value of the label beside it, and the image's ENV of that name.
METADATA = (
    (Env.NAME, LABEL_NAME),
    (Env.FINGERPRINT, LABEL_FINGERPRINT),
    (Env.LOCK_SHA256, LABEL_LOCK),
    (Env.TORCH, LABEL_TORCH),
    (Env.PYTHON, LABEL_PYTHON),
    (Env.BASE, LABEL_BASE),
    (Env.BASE_ID, LABEL_BASE_ID),
    (Env.VERSION, LABEL_VERSION),
)
METADATA_ARGS = tuple(arg for arg, _ in METADATA)


# --- the build plan -----------------------------------------------------------------------------------------


class BuildPlan(BaseModel):
    """What ``nodekit build`` will do, complete enough to print for ``--dry-run`` and to run as is."""

    model_config = FROZEN

    name: str
    tag: str
    fingerprint: str
    base_image: str
    base_id: str
    lock_sha256: str
    python: str
    torch: str
    packages: int
    dockerfile: Path
    context: Path
    build_contexts: tuple[tuple[str, Path], ...]
    build_args: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    code_files: int
    code_bytes: int
    launcher_files: int
    no_cache: bool = False
    layer_keys: tuple[tuple[str, str], ...] = ()
    """Per package layer (:data:`PACKAGE_LAYERS`), the sha256 of everything its files depend on: the blob store
    keeps a layer under it, so an unchanged layer is never built or exported again."""

    def describe(self) -> str:
        """The plan as text, for ``nodekit build --dry-run``."""
        rows = [
            ("image", self.tag),
            ("fingerprint", self.fingerprint),
            ("base", f"{self.base_image} ({self.base_id})"),
            ("python", self.python),
            ("torch", self.torch),
            ("lock", f"{self.packages} packages, sha256 {self.lock_sha256}"),
            ("code", f"{self.code_files} files, {self.code_bytes} bytes"),
            ("launcher", f"{self.launcher_files} files"),
            ("dockerfile", str(self.dockerfile)),
            ("context", str(self.context)),
            *((f"context {k}", str(v)) for k, v in self.build_contexts),
            # The metadata arguments only carry the labels below into the Dockerfile; listing them twice is noise.
            *((f"build-arg {k}", v) for k, v in self.build_args if k not in METADATA_ARGS),
            *((f"label {k}", v) for k, v in self.labels),
        ]
        if self.no_cache:
            rows.append(("cache", "disabled (--no-cache)"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def layer_key(plan: BuildPlan, name: str) -> str:
    """The key the blob store keeps the package layer ``name`` of ``plan`` under."""
    return dict(plan.layer_keys)[name]


def layer_keys(base_id: str, lock_text: str, dockerfile_text: str, args: Mapping[str, str]) -> dict[str, str]:
    """Pure: each package layer's key. The environment layer depends on the base, the Dockerfile, the build
    arguments and the CUDA libraries' pins; the framework and packages layers on the environment and their own pins
    (each is built on the environment alone); the packages layer also carries the whole lock (it is copied in)."""
    split = split_lock(lock_text)

    def key(**parts: str) -> str:
        return sha256_text(json.dumps({"scheme": LAYER_SCHEME, **parts}, sort_keys=True))

    env = key(base=base_id, dockerfile=sha256_text(dockerfile_text), args=json.dumps(sorted(args.items())),
              lock=sha256_text(split.cuda_libs))  # fmt: skip
    return {
        "env": env,
        "framework": key(env=env, lock=sha256_text(split.framework)),
        "packages": key(env=env, lock=sha256_text(split.packages), whole=sha256_text(lock_text)),
    }


def input_build_args(base_image: str, base_python: str = "python3", base_site: Sequence[str] = ()) -> dict[str, str]:
    """The Dockerfile arguments that shape the filesystem; they are fingerprint inputs.

    ``base_python`` is the base's interpreter the job's environment is made from (the probe's answer) and
    ``base_site`` its site directories, which that environment keeps seeing (what the base provides stays).
    """
    return {
        "BASE_IMAGE": base_image,
        "BASE_PYTHON": base_python,
        "BASE_SITE": json.dumps(list(base_site)),
        "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
    }


def image_labels(
    *, name: str, fp: str, lock_sha256: str, torch: str, python: str, base_image: str, base_id: str, version: str
) -> dict[str, str]:
    """The labels every nodekit image carries (the Dockerfile sets them from the metadata arguments)."""
    return {
        LABEL_NAME: name,
        LABEL_FINGERPRINT: fp,
        LABEL_LOCK: lock_sha256,
        LABEL_TORCH: torch,
        LABEL_PYTHON: python,
        LABEL_BASE: base_image,
        LABEL_BASE_ID: base_id,
        LABEL_VERSION: version,
    }


def _metadata_args(labels: Mapping[str, str]) -> dict[str, str]:
    return {arg: labels[label] for arg, label in METADATA}


def plan_build(
    *,
    name: str,
    base_image: str,
    base_id: str,
    lock_text: str,
    torch: str,
    packages: int,
    python: str,
    dockerfile_text: str,
    launcher: Sequence[TreeEntry],
    code: Sequence[TreeEntry],
    stage_dir: Path,
    version: str,
    no_cache: bool = False,
    base_python: str = "python3",
    base_site: Sequence[str] = (),
) -> BuildPlan:
    """The build of ``name`` from these inputs, its contexts staged under ``stage_dir`` (see STAGE_*)."""
    args = input_build_args(base_image, base_python, base_site)
    inputs = StackInputs(
        base_id=base_id,
        lock_text=lock_text,
        dockerfile_text=dockerfile_text,
        build_args=tuple(sorted(args.items())),
        launcher=tuple(launcher),
        code=tuple(code),
    )
    fp = fingerprint(inputs)
    lock_sha = sha256_text(lock_text)
    labels = image_labels(
        name=name,
        fp=fp,
        lock_sha256=lock_sha,
        torch=torch,
        python=python,
        base_image=base_image,
        base_id=base_id,
        version=version,
    )
    return BuildPlan(
        name=name,
        tag=image_tag(name, fp),
        fingerprint=fp,
        base_image=base_image,
        base_id=base_id,
        lock_sha256=lock_sha,
        python=python,
        torch=torch,
        packages=packages,
        dockerfile=stage_dir / fp[:TAG_LENGTH] / STAGE_DOCKERFILE,
        context=stage_dir / fp[:TAG_LENGTH] / STAGE_LAUNCHER,
        build_contexts=(
            (STAGE_CODE, stage_dir / fp[:TAG_LENGTH] / STAGE_CODE),
            (STAGE_WHEELS, stage_dir / STAGE_WHEELS),
            (STAGE_FRAMEWORK, stage_dir / STAGE_FRAMEWORK),
            (STAGE_CUDA_LIBS, stage_dir / STAGE_CUDA_LIBS),
        ),
        build_args=tuple(sorted({**args, **_metadata_args(labels)}.items())),
        labels=tuple(sorted(labels.items())),
        code_files=sum(1 for e in code if e.kind == "file"),
        code_bytes=sum(e.size for e in code),
        launcher_files=sum(1 for e in launcher if e.kind == "file"),
        no_cache=no_cache,
        layer_keys=tuple(layer_keys(base_id, lock_text, dockerfile_text, args).items()),
    )


__all__ = [
    "CUDA_LIBS_PACKAGE",
    "DEFAULT_EXCLUDES",
    "ENTRYPOINT",
    "FINGERPRINT_SCHEME",
    "FRAMEWORK_PACKAGE",
    "IMAGE_ENV",
    "PACKAGE_LAYERS",
    "TAG_LENGTH",
    "WORKDIR",
    "BuildPlan",
    "IgnoreRules",
    "LockLayers",
    "PackageLayer",
    "StackInputs",
    "TreeEntry",
    "fingerprint",
    "ignore_rules",
    "image_labels",
    "image_tag",
    "input_build_args",
    "layer_key",
    "layer_keys",
    "normal_mode",
    "parse_dockerignore",
    "plan_build",
    "split_lock",
]
