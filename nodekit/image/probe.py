"""What the base image provides, read from the image itself instead of assumed.

One throw-away container of the base, offline (``--network none``) and with a deadline, runs a standard-library
script with the Python the job will run (the first ``python3``/``python`` on the base's PATH, the way conda and
NGC images put theirs first) and prints one JSON line: that Python's path and kind (venv, conda or system), its
version, the C library (so the manylinux tags its wheels may carry), the CPU architecture, whether pip and venv's
ensurepip are there, its site directories, and every installed distribution with its version (torch's own
version file adds its CUDA/HIP build). The answer is cached by the base's image id under ``.nodekit/base-probe``:
an image id names immutable content, so the cache never goes stale.

:func:`parse_probe` and :func:`check_usable` are pure; :func:`probe_base` runs the container (or reads the
cache); :func:`target` turns settings plus the probe into the Python version and wheel platform to resolve for.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from pydantic import BaseModel

from nodekit.config.settings import Settings
from nodekit.errors import ConfigError, ImageError
from nodekit.system.files import write_atomic
from nodekit.system.frozen import FROZEN

if TYPE_CHECKING:
    from nodekit.system.docker import ImageInfo

PROBE_DIR = Path(".nodekit") / "base-probe"


class Inspect(Enum):
    """``base`` left out: the function inspects the configured base image in the engine itself."""

    HERE = "inspect the base image here"


INSPECT = Inspect.HERE
# The base image as a caller already inspected it (None: not in the engine), or INSPECT.
BaseGiven: TypeAlias = "ImageInfo | Literal[Inspect.HERE] | None"

# The launcher's own floor (zip(strict=...), PEP 604 unions at run time in dataclasses) and torch 2.13's.
MIN_PYTHON = (3, 10)
PROBE_TIMEOUT = 60.0
PROBE_SCHEME = 1
# nodekit's own bases, known without probing, so `nodekit lock` works without an engine for them.
KNOWN_BASES = {
    "nodekit/base:bookworm": ("3.11", "manylinux_2_36"),
    "nodekit/base:trixie": ("3.13", "manylinux_2_41"),
}

# Shared by the base probe and `nodekit inspect`, run inside an image with its own Python: the installed
# distributions (the first on sys.path wins, as an import would) and torch's build facts read from its version.py,
# metadata only (importing torch takes seconds). Needs ast, importlib.metadata as md, importlib.util, os, re.
DISTS_AND_TORCH = r"""
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name:
        dists.setdefault(re.sub(r"[-_.]+", "-", name).lower(), d.version)
torch = {}
spec = importlib.util.find_spec("torch")
if spec is not None and spec.origin:
    p = os.path.join(os.path.dirname(spec.origin), "version.py")
    if os.path.isfile(p):
        for node in ast.parse(open(p).read()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
                try:
                    torch[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
"""

# Runs inside the base with its own Python: standard library only.
PROBE_SCRIPT = (
    "import ast, importlib.metadata as md, importlib.util, json, os, platform, re, site, sys, sysconfig\n"
    + DISTS_AND_TORCH
    + r"""libc, libc_version = platform.libc_ver()
try:
    gnu = os.confstr("CS_GNU_LIBC_VERSION") or ""
except (ValueError, OSError):
    gnu = ""
if gnu.startswith("glibc "):
    libc, libc_version = "glibc", gnu.split()[1]
if os.path.isdir(os.path.join(sys.prefix, "conda-meta")):
    kind = "conda"
elif sys.prefix != sys.base_prefix:
    kind = "venv"
else:
    kind = "system"
dirs = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")] + list(getattr(site, "getsitepackages", list)())
print(json.dumps({
    "python": sys.executable, "kind": kind, "version": platform.python_version(),
    "implementation": sys.implementation.name, "libc": libc, "libc_version": libc_version,
    "machine": platform.machine(), "pip": importlib.util.find_spec("pip") is not None,
    "ensurepip": importlib.util.find_spec("ensurepip") is not None,
    "site": list(dict.fromkeys(d for d in dirs if os.path.isdir(d))),
    "dists": dists, "torch": {k: v for k, v in torch.items() if isinstance(v, (str, int, type(None)))},
}))
"""
)

# sh, not python, is the entrypoint: which Python runs the job is exactly what is being asked.
PROBE_SHELL = (
    'for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$NODEKIT_PROBE"; fi; done; '
    'echo "nodekit-probe: no python"'
)


class BaseStack(BaseModel):
    """The base image's Python stack, as the probe reported it."""

    model_config = FROZEN

    image_id: str
    python: str  # the interpreter the job runs (path in the image); "" when the base has no Python
    kind: Literal["venv", "conda", "system", "none"]
    version: str = ""
    implementation: str = "cpython"
    libc: str = ""
    libc_version: str = ""
    machine: str = ""
    pip: bool = False
    ensurepip: bool = False
    site: tuple[str, ...] = ()
    dists: dict[str, str] = {}
    torch_build: dict[str, str | int | None] = {}

    @property
    def python_version(self) -> str:
        """``major.minor`` of the base's Python."""
        return ".".join(self.version.split(".")[:2])

    @property
    def wheel_platform(self) -> str:
        """The newest manylinux tag the base's glibc runs (``manylinux_2_36_x86_64``); musl: musllinux."""
        m = re.match(r"(\d+)\.(\d+)", self.libc_version)
        if m is None:
            return ""
        family = "musllinux" if self.libc == "musl" else "manylinux"
        return f"{family}_{m[1]}_{m[2]}_{self.machine}"

    @property
    def torch(self) -> str | None:
        v = self.torch_build.get("__version__") or self.dists.get("torch")
        return str(v) if v else None

    @property
    def cuda(self) -> str | None:
        v = self.torch_build.get("cuda") or self.torch_build.get("hip")
        return str(v) if v else None

    def provided(self) -> dict[str, str]:
        """Distributions the base installs that the job's environment will see (constraints for the lock).

        pip, setuptools and wheel are the installer's own tools, not the job's dependencies.
        """
        return {n: v for n, v in self.dists.items() if n not in ("pip", "setuptools", "wheel")}

    def describe(self) -> str:
        if self.kind == "none":
            return "no Python"
        torch = f", torch {self.torch}" + (f" (CUDA {self.cuda})" if self.cuda else "") if self.torch else ""
        return (
            f"Python {self.version} ({self.kind}, {self.python}), {self.libc} {self.libc_version}, {self.machine}, "
            f"{len(self.provided())} packages{torch}"
        )


def parse_probe(image_id: str, output: str) -> BaseStack:
    """Pure: the probe's output (its last JSON line) as a :class:`BaseStack`; no Python when it found none."""
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    if not lines or lines[-1].strip() == "nodekit-probe: no python":
        return BaseStack(image_id=image_id, python="", kind="none")
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        raise ImageError(
            f"the probe of base image {image_id[:19]} printed no report: {lines[-1][:200]}",
            fix="check that the base image's python3 runs (docker run --rm <base> python3 -V)",
        ) from None
    torch = doc.pop("torch", {})
    return BaseStack(image_id=image_id, torch_build=torch, **doc)


def check_usable(stack: BaseStack, base_image: str) -> None:
    """Pure: ImageError naming what is missing when the base cannot run nodekit's image, with the fix."""
    floor = ".".join(map(str, MIN_PYTHON))
    if stack.kind == "none":
        raise ImageError(
            f"base image {base_image} has no Python (no python3 or python on its PATH)",
            fix=f'use a base with Python >= {floor} (install python3 in it), or base_image = "nodekit/base:bookworm"',
        )
    parts = tuple(int(x) for x in re.findall(r"\d+", stack.version)[:2])
    if parts < MIN_PYTHON:
        raise ImageError(
            f"base image {base_image} has Python {stack.version} ({stack.python}); nodekit's launcher needs >= {floor}",
            fix=f'use a base with Python >= {floor}, or base_image = "nodekit/base:trixie" (Python 3.13)',
        )
    if stack.implementation != "cpython":
        raise ImageError(
            f"base image {base_image} runs {stack.implementation}, not CPython", fix="use a base with CPython"
        )
    if not stack.pip and not stack.ensurepip:
        raise ImageError(
            f"base image {base_image} has Python {stack.version} but no way to install packages (neither pip "
            "nor ensurepip)",
            fix="install pip in the base (apt-get install python3-pip, or python3-venv), then nodekit build",
        )
    if not stack.wheel_platform:
        raise ImageError(
            f"base image {base_image}: cannot tell its C library ({stack.libc or 'unknown'})",
            fix="set wheel_platform in nodekit.toml (e.g. manylinux_2_35_x86_64)",
        )


def cache_path(project_dir: Path, image_id: str) -> Path:
    return project_dir / PROBE_DIR / f"{image_id.removeprefix('sha256:')}.json"


def probe_base(
    settings: Settings, *, refresh: bool = False, base: BaseGiven = INSPECT, cached_only: bool = False
) -> BaseStack:
    """The configured base image's stack: from the cache for its image id, else from one offline container.

    ``base``: the base image as the caller already inspected it (None: not in the engine); by default it is
    inspected here. Raises ImageError when the base is not in the engine or the probe cannot run; does not judge
    the answer (see :func:`check_usable`). ``cached_only`` (dry runs): the cache or ImageError, never a container.
    """
    from nodekit.system import docker

    info = docker.image_info(settings.base_image) if base is INSPECT else base
    if info is None:
        raise ImageError(
            f"base image {settings.base_image} is not in the local Docker engine, and nodekit does not pull "
            "blindly (no registry may be reachable)",
            fix="nodekit base (creates a minimal Debian base), or docker load the base you use",
        )
    path = cache_path(settings.project_dir, info.id)
    if not refresh:
        try:
            doc = json.loads(path.read_text())
            if doc.get("scheme") == PROBE_SCHEME:
                return BaseStack.model_validate(doc["stack"])
        except (OSError, ValueError, KeyError):
            pass
    if cached_only:
        raise ImageError(
            f"the base image {settings.base_image} has not been probed on this machine yet, and a dry run starts "
            "no container",
            fix="nodekit build (probes it once), or leave out --dry-run",
        )
    out = docker.probe_image(info.id, PROBE_SHELL, env={"NODEKIT_PROBE": PROBE_SCRIPT}, timeout=PROBE_TIMEOUT)
    stack = parse_probe(info.id, out)
    text = json.dumps({"scheme": PROBE_SCHEME, "stack": stack.model_dump()}, indent=1) + "\n"
    write_atomic(path, text, within=settings.project_dir)
    return stack


class WheelTarget(BaseModel):
    """What the image's packages are resolved for: settings win, then the probe, then nodekit's known bases."""

    model_config = FROZEN

    python_version: str
    wheel_platform: str
    stack: BaseStack | None = None
    source: str  # "settings", "probe" or "known base"


def derive_target(
    base_image: str,
    python_version: str | None,
    wheel_platform: str | None,
    stack: BaseStack | None,
    machine: str = "x86_64",
) -> WheelTarget:
    """Pure: the resolution target from the settings' overrides, the probe (when there is one), or the known
    defaults of nodekit's own bases. ConfigError when none of them says."""
    if python_version and wheel_platform:
        return WheelTarget(python_version=python_version, wheel_platform=wheel_platform, stack=stack, source="settings")
    if stack is not None and stack.kind != "none":
        return WheelTarget(
            python_version=python_version or stack.python_version,
            wheel_platform=wheel_platform or stack.wheel_platform,
            stack=stack,
            source="probe",
        )
    known = KNOWN_BASES.get(base_image)
    if known is not None:
        return WheelTarget(
            python_version=python_version or known[0],
            wheel_platform=wheel_platform or f"{known[1]}_{machine}",
            stack=stack,
            source="known base",
        )
    raise ConfigError(
        f"cannot tell the Python and wheel platform of base image {base_image} without probing it",
        fix="make the base image available to the Docker engine, or set python_version and wheel_platform",
    )


def target(
    settings: Settings,
    *,
    require_probe: bool = False,
    base: BaseGiven = INSPECT,
    cached_only: bool = False,
) -> WheelTarget:
    """The resolution target for ``settings``. Probes the base when the engine has it (cached by image id);
    ``base`` as for :func:`probe_base`.

    Without an engine or the base, nodekit's own bases and explicit settings still answer (so ``nodekit lock``
    works offline for them); ``require_probe`` makes those cases errors instead (the build needs the probe to
    keep what the base provides). Raises ImageError for a base that cannot work (:func:`check_usable`).
    ``cached_only``: as for :func:`probe_base`.
    """
    import platform

    from nodekit.errors import EngineError

    stack: BaseStack | None = None
    try:
        stack = probe_base(settings, base=base, cached_only=cached_only)
    except (EngineError, ImageError):
        if require_probe:
            raise
    if stack is not None:
        check_usable(stack, settings.base_image)
    return derive_target(
        settings.base_image, settings.python_version, settings.wheel_platform, stack, platform.machine()
    )
