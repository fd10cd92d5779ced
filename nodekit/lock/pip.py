"""The pip commands the lock runs, built as data, and the one place that runs them.

Every command is the host's pip (``sys.executable -m pip`` or the ``PIP_RUNNER`` script below) with the user's pip
configuration plus nodekit's package sources; :func:`run` gives each a deadline and turns a hang into one line.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from nodekit import deadline
from nodekit.lock.format import target_environment

FIX_ACCESS = "check access to your package index (pip config, proxy), then nodekit lock again"


def compatible_platforms(platform: str) -> tuple[str, ...]:
    """Every platform tag the image accepts, best first.

    pip's ``--platform manylinux_2_36_x86_64`` accepts only that exact tag, while a glibc 2.36 system runs
    every older manylinux wheel too (torch ships manylinux_2_28), so nodekit lists them all.
    """
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if m is None:
        return (platform,)
    major, minor, arch = int(m[1]), int(m[2]), m[3]
    if major != 2:
        return (platform,)
    lowest = 5 if arch in ("x86_64", "i686") else 17
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for v in range(minor, lowest - 1, -1):
        tags.append(f"manylinux_2_{v}_{arch}")
        if v in legacy:  # the old spelling ranks right after its PEP 600 twin, as in packaging.tags
            tags.append(f"{legacy[v]}_{arch}")
    return tuple(tags)


def target_options(python_version: str, platform: str) -> list[str]:
    """pip options that resolve for the image: binary wheels only, its platforms, its Python and ABI."""
    abi = "cp" + python_version.replace(".", "")
    opts = ["--only-binary=:all:"]
    for p in compatible_platforms(platform):
        opts += ["--platform", p]
    return [*opts, "--python-version", python_version, "--implementation", "cp", "--abi", abi]


_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with the user:password of every URL in it replaced by ``***`` (for anything printed or written)."""
    return _URL_USERINFO.sub(r"\g<scheme>***@", text)


def source_options(index_url: str | None, extra_index_urls: Sequence[str], find_links: Sequence[str]) -> list[str]:
    """pip options for the configured package sources (they add to the user's pip configuration)."""
    opts = ["--index-url", index_url] if index_url else []
    for url in extra_index_urls:
        opts += ["--extra-index-url", url]
    for link in find_links:
        opts += ["--find-links", link]
    return opts


# pip's --python-version decides which wheels fit, but pip evaluates environment markers (`foo; python_version <
# "3.12"`) against the interpreter running it (checked with pip 23.2: a 3.13 target still took the 3.11 branch).
# So pip runs with packaging's default marker environment replaced by the image's; argv[1] is that environment.
PIP_RUNNER = (
    "import json, sys\n"
    "import pip._vendor.packaging.markers as m\n"
    "_env = json.loads(sys.argv[1]); _base = m.default_environment\n"
    "m.default_environment = lambda: {**_base(), **_env}\n"
    "from pip._internal.cli.main import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def resolve_argv(
    python: str,
    requirements: Path,
    report: Path,
    target: Path,
    constraints: Path | None,
    *,
    python_version: str,
    platform: str,
    sources: Sequence[str] = (),
    full_version: str | None = None,
) -> list[str]:
    """The resolving pip command: a dry-run install whose JSON report names and hashes every wheel, with markers
    evaluated for the image (see ``PIP_RUNNER``)."""
    markers = json.dumps(target_environment(python_version, platform, full_version), sort_keys=True)
    argv = [python, "-c", PIP_RUNNER, markers]
    argv += ["install", "--dry-run", "--ignore-installed", "--quiet", "--disable-pip-version-check"]
    # pip allows --platform only with --target, even for a dry run; nothing is written there.
    argv += ["--target", str(target), "--report", str(report), *target_options(python_version, platform)]
    argv += [*sources, "--requirement", str(requirements)]
    if constraints is not None:
        argv += ["--constraint", str(constraints)]
    return argv


def download_argv(
    python: str, requirements: Path, dest: Path, *, python_version: str, platform: str, sources: Sequence[str] = ()
) -> list[str]:
    """The refilling pip command: exactly the pinned wheels, hashes checked, no dependencies resolved."""
    return [
        python, "-m", "pip", "download", "--no-deps", "--require-hashes", "--quiet", "--disable-pip-version-check",
        *target_options(python_version, platform), *sources, "--dest", str(dest), "--requirement", str(requirements),
    ]  # fmt: skip


def run(argv: Sequence[str], *, what: str, fix: str) -> subprocess.CompletedProcess[str]:
    """Run one pip command with pip's deadline: DeadlineError naming ``what`` when it hangs."""
    return deadline.run(argv, timeout=deadline.PIP_TIMEOUT_S, what=what, fix=fix)


def pip_error(stderr: str) -> str:
    """The line of pip's output that says what went wrong."""
    errors = [ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("ERROR:")]
    lines = errors or [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[0].removeprefix("ERROR: ") if lines else "pip failed without a message"
