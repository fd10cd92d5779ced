"""The pip commands the lock runs, built as data, and the one place that runs them.

Every command is the host's pip (``sys.executable -m pip`` or the ``PIP_RUNNER`` script below) with the user's pip
configuration plus nodekit's package sources; :func:`run` gives each a deadline and turns a hang into one line.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from nodekit.config.settings import Settings
from nodekit.image.lock.format import target_environment
from nodekit.system import proc

# Resolving or downloading wheels: generous (a large index on a slow link), but not forever.
PIP_TIMEOUT_S = 1800.0

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
# So pip runs with packaging's default marker environment replaced by the image's (argv[1], a JSON object; empty
# for commands about the host). argv[2] holds the rest of the run's setup as JSON: "env" (variables for pip and
# the build backends it starts), "umask", and "sdists": pip refuses --platform/--python-version unless every
# distribution is a wheel (check_dist_restriction); nodekit lifts that check because it builds the source
# distributions itself, on the host, and refuses any whose wheel is not pure Python (nodekit.image.lock.sdist).
PIP_RUNNER = (
    "import json, os, sys\n"
    "_env, _opts = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
    "os.environ.update(_opts.get('env', {}))\n"
    "if 'umask' in _opts:\n"
    "    os.umask(_opts['umask'])\n"
    "import pip._vendor.packaging.markers as m\n"
    "_base = m.default_environment\n"
    "m.default_environment = lambda: {**_base(), **_env}\n"
    "if _opts.get('sdists'):\n"
    "    import pip._internal.cli.cmdoptions as c\n"
    "    c.check_dist_restriction = lambda *a, **k: None\n"
    "from pip._internal.cli.main import main\n"
    "sys.exit(main(sys.argv[3:]))\n"
)
_QUIET = ["--quiet", "--disable-pip-version-check"]


def runner_argv(
    python: str,
    markers: Mapping[str, str],
    *,
    sdists: bool = False,
    env: Mapping[str, str] | None = None,
    umask: int | None = None,
) -> list[str]:
    """The start of a pip command run through ``PIP_RUNNER``; pip's own arguments follow."""
    opts: dict[str, object] = {"sdists": sdists, "env": dict(env or {})}
    if umask is not None:
        opts["umask"] = umask
    return [python, "-c", PIP_RUNNER, json.dumps(dict(markers), sort_keys=True), json.dumps(opts, sort_keys=True)]


def image_options(python_version: str, platform: str) -> list[str]:
    """The image's platforms, Python and ABI, with no rule on wheels or sources."""
    return target_options(python_version, platform)[1:]


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
    argv = runner_argv(python, target_environment(python_version, platform, full_version), sdists=True)
    # Not --quiet: pip says why a resolution is impossible ("The conflict is caused by: ...") at its info level.
    argv += ["install", "--dry-run", "--ignore-installed", "--disable-pip-version-check"]
    # pip allows --platform only with --target, even for a dry run; nothing is written there. --prefer-binary:
    # a wheel whenever some allowed version has one, a source distribution only where none has (antlr4).
    argv += ["--target", str(target), "--report", str(report), "--prefer-binary"]
    argv += [*image_options(python_version, platform), *sources, "--requirement", str(requirements)]
    if constraints is not None:
        argv += ["--constraint", str(constraints)]
    return argv


def newest_argv(
    python: str,
    requirements: Path,
    report: Path,
    target: Path,
    *,
    python_version: str,
    platform: str,
    sources: Sequence[str] = (),
    full_version: str | None = None,
) -> list[str]:
    """The newest release of each requirement alone (no dependencies) that the image can take, wheel or source."""
    argv = runner_argv(python, target_environment(python_version, platform, full_version), sdists=True)
    argv += ["install", "--dry-run", "--ignore-installed", "--no-deps", *_QUIET]
    argv += ["--target", str(target), "--report", str(report), *image_options(python_version, platform)]
    return [*argv, *sources, "--requirement", str(requirements)]


def download_argv(
    python: str, requirements: Path, dest: Path, *, python_version: str, platform: str, sources: Sequence[str] = ()
) -> list[str]:
    """The refilling pip command: exactly the pinned wheels, hashes checked, no dependencies resolved."""
    return [
        python, "-m", "pip", "download", "--no-deps", "--require-hashes", *_QUIET,
        *target_options(python_version, platform), *sources, "--dest", str(dest), "--requirement", str(requirements),
    ]  # fmt: skip


def sdist_download_argv(python: str, name: str, requirements: Path, dest: Path, sources: Sequence[str]) -> list[str]:
    """One source distribution, its hash checked (``requirements`` holds ``name==version --hash=sha256:...``)."""
    return [
        python, "-m", "pip", "download", "--no-deps", "--require-hashes", f"--no-binary={name}", *_QUIET, *sources,
        "--dest", str(dest), "--requirement", str(requirements),
    ]  # fmt: skip


def backend_argv(python: str, requires: Sequence[str], report: Path, sources: Sequence[str]) -> list[str]:
    """Resolving a build backend's requirements for the host (the build runs here, not in the image)."""
    return [
        python, "-m", "pip", "install", "--dry-run", "--ignore-installed", *_QUIET, "--report", str(report),
        *sources, *requires,
    ]  # fmt: skip


def wheel_argv(
    python: str, sdist: Path, out: Path, sources: Sequence[str], *, env: Mapping[str, str], umask: int
) -> list[str]:
    """Building one wheel from a local source distribution in pip's isolated build environment; ``env`` pins
    that environment and fixes what would make the bytes differ (time, hash seed), as does ``umask``."""
    argv = runner_argv(python, {}, env=env, umask=umask)
    return [*argv, "wheel", "--no-deps", "--no-cache-dir", *_QUIET, *sources, "--wheel-dir", str(out), str(sdist)]


class Finished(Protocol):
    """What a finished pip command gives back (``subprocess.CompletedProcess`` and ``nodekit.system.proc.Result``
    both)."""

    @property
    def returncode(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


class ResolveFailed(Exception):
    """pip could not resolve; the message is pip's error line, ``output`` all it said (stderr, then stdout)."""

    def __init__(self, stderr: str, stdout: str = "") -> None:
        super().__init__(pip_error(stderr))
        self.output = stderr + "\n" + stdout


def run(argv: Sequence[str], *, what: str, fix: str) -> Finished:
    """Run one pip command with pip's deadline: DeadlineError naming ``what`` when it hangs. The only place the
    lock starts a process."""
    return proc.run(argv, deadline=PIP_TIMEOUT_S, what=what, fix=fix)


def dry_run_report(
    d: Path,
    requirements: Sequence[str],
    argv_for: Callable[..., list[str]],
    *,
    what: str,
    failed: Callable[[Finished], Exception],
    **target: Any,
) -> dict[str, Any]:
    """pip's JSON report of a dry-run install of ``requirements``, in the directory ``d``. The command is
    ``argv_for(python, requirements file, report file, target directory, **target)`` (``newest_argv``, or
    ``resolve_argv`` with its constraints); ``failed(finished)`` is raised when pip fails."""
    (d / "requirements.txt").write_text("\n".join(requirements) + "\n")
    argv = argv_for(sys.executable, d / "requirements.txt", d / "report.json", d / "target", **target)
    finished = run(argv, what=what, fix=FIX_ACCESS)
    if finished.returncode != 0:
        raise failed(finished)
    report: dict[str, Any] = json.loads((d / "report.json").read_text())
    return report


def sources(settings: Settings) -> list[str]:
    """pip options for the project's package sources."""
    return source_options(settings.index_url, settings.extra_index_urls, settings.find_links)


def pip_error(stderr: str) -> str:
    """The line of pip's output that says what went wrong."""
    errors = [ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("ERROR:")]
    lines = errors or [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[0].removeprefix("ERROR: ") if lines else "pip failed without a message"


def conflict_reason(stderr: str) -> str:
    """Why pip found no solution, from its "The conflict is caused by:" lines (else its error line)."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    if "The conflict is caused by:" not in lines:
        return pip_error(stderr)
    causes = []
    for ln in lines[lines.index("The conflict is caused by:") + 1 :]:
        if not ln:
            break
        ln = ln.replace("The user requested (constraint) ", "a constraint pins ")
        causes.append(ln.replace("The user requested ", "nodekit.toml asks for "))
    return "; ".join(causes)
