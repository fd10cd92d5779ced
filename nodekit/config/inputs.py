"""What user-given text and numbers may be: pure checks shared by ``settings.py`` (nodekit.toml, ``NODEKIT_*``,
flags) and ``nodekit/backends/fleet/hosts.py``. Each check returns None, or the problem as a phrase the caller puts
beside the key.

The bounds, and why they are where they are:

- :data:`MAX_NODES` (10,000): every node's container carries one ``rank:count`` entry per node in
  NODEKIT_NPROC_DECLARED; at 10,000 nodes with counts up to :data:`MAX_PROCS` that variable is under 100 KiB,
  below Linux's 128 KiB limit on one environment string (MAX_ARG_STRLEN: past it the container cannot even
  start). It is also several times the largest published single torchrun jobs (2,000-3,000 nodes), and planning
  it takes milliseconds; ``nnodes = 10**7`` took 49 s and 1 GB before it failed.
- :data:`MAX_PROCS` (1,024) processes or GPUs per node: more than the hardware threads of any two-socket server
  (one worker per core is the most anyone runs); each worker is a full Python process.
- :data:`MAX_TIMEOUT_S` (7 days) for ``rdzv_timeout``, ``peer_timeout`` and ``stall_timeout``: the launcher adds
  to them and hands them to ``timedelta`` (at most 8.6e13 s), to torch's stores (int64 milliseconds, 9.2e12 s)
  and to Python's waits (``threading.TIMEOUT_MAX``, 9.2e9 s); a week is far inside all three, and no rendezvous
  waits a week.
- :data:`MAX_ARG_BYTES`: one argument or ``KEY=value`` string, Linux's MAX_ARG_STRLEN less its NUL.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import socket
import unicodedata
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from nodekit.launcher.config import MAX_TIMEOUT_S, MIN_PEER_TIMEOUT, MIN_STALL_TIMEOUT
from nodekit.launcher.contract import OUTPUT_DIR, WORKDIR

MAX_NODES = 10_000
MAX_PROCS = 1024
MAX_ARG_BYTES = 128 * 1024 - 1
MAX_NAME = 128  # image names: Docker refuses references over 255 characters; nodekit/<name>:<tag> must fit
__all__ = [
    "MAX_ARG_BYTES", "MAX_NAME", "MAX_NODES", "MAX_PROCS", "MAX_TIMEOUT_S", "MIN_PEER_TIMEOUT", "MIN_STALL_TIMEOUT",
]  # fmt: skip

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# RFC 1123 labels, plus "_": ssh's own host aliases (~/.ssh/config) and /etc/hosts names often have one.
_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
# Mount targets nodekit itself uses, and system directories a bind mount would replace under the job's feet.
OWN_TARGETS = frozenset({OUTPUT_DIR, WORKDIR, "/opt/venv", "/opt/nodekit"})
SYSTEM_TARGETS = frozenset({"/", "/opt", "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64"})


def text_problem(value: str, *, lines: bool = False) -> str | None:
    """Why ``value`` cannot reach a file, an environment or an argv intact: a NUL (C strings end there), a lone
    surrogate (undecodable bytes from the shell; not UTF-8), or, unless ``lines``, any control character."""
    if "\x00" in value:
        return "contains a NUL character"
    if any("\ud800" <= c <= "\udfff" for c in value):
        return "is not valid UTF-8 (undecodable bytes)"
    if not lines:
        bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
        if bad is not None:
            return f"contains the control character {bad!r}"
    return None


def strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string in a settings value (keys too, paths as text), each with where it sits (``env.KEY``)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, PurePath):
        yield where, str(value)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from strings(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k, where)
            yield from strings(v, f"{where}.{k}")
    elif isinstance(value, tuple | list):
        for i, v in enumerate(value):
            yield from strings(v, f"{where}.{i}")


def too_long(value: str) -> bool:
    return len(value.encode("utf-8", "surrogateescape")) > MAX_ARG_BYTES


def env_name_problem(name: str) -> str | None:
    if not ENV_NAME.match(name):
        return f"{name!r} is not a variable name (letters, digits and _, not starting with a digit)"
    return None


def module_problem(module: str) -> str | None:
    if not _MODULE.match(module):
        return f"{module!r} is not a dotted Python module name (pkg.train)"
    return None


def script_problem(script: str) -> str | None:
    parts = PurePath(script).parts
    if not script.strip():
        return "is empty"
    if PurePath(script).is_absolute():
        return f"{script!r} must be relative to the project root"
    if ".." in parts:
        return f"{script!r} has a '..' part: the script must be inside the project directory, all the image holds"
    return None


def path_problem(path: str) -> str | None:
    """An absolute path as Linux and Docker take it: written plainly (no ``.``/``..``/``//``), within PATH_MAX and
    NAME_MAX, no control characters."""
    bad = text_problem(path)
    if bad is not None:
        return f"{path!r} {bad}"
    if not path.startswith("/"):
        return f"mount path {path!r} is not absolute"
    plain = posixpath.normpath("/" + path.lstrip("/"))  # normpath alone keeps a leading "//"
    if plain != (path.rstrip("/") or "/"):
        return f"mount path {path!r} is not written plainly (write {plain!r})"
    if len(path.encode()) > 4095 or any(len(p.encode()) > 255 for p in path.split("/")):
        return f"mount path {path[:40]!r}... is longer than Linux allows (4095 bytes, 255 per name)"
    return None


def target_problem(target: str, checked: bool) -> str | None:
    """A mount target the job can use: not nodekit's own, not one that hides them or the system; a checked one
    also travels in NODEKIT_DATA_CHECK, a comma-separated list."""
    if target in OWN_TARGETS or target in SYSTEM_TARGETS:
        own = ", ".join(sorted(OWN_TARGETS))
        return f"mount target {target!r} would replace nodekit's own ({own}) or a system directory"
    if checked and "," in target:
        return f'mount target {target!r} has a comma, which the same-data check cannot carry (check = "none" can)'
    return None


def iface_problem(value: str) -> str | None:
    """An interface name as Linux allows it (1 to 15 bytes; no ``/``, ``:`` or spaces), or a comma list of them,
    which gloo and NCCL both take."""
    for name in value.split(","):
        if not 0 < len(name.encode()) <= 15 or name in (".", "..") or re.search(r"[/:\s]|[\x00-\x1f]", name):
            return f"{value!r} is not a network interface name (1 to 15 characters, no '/', ':' or spaces)"
    return None


def ip_problem(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IP address"
    return None


def hostname_problem(host: str) -> str | None:
    """An IP address, or a host name (RFC 1123 labels or ssh aliases, 253 characters at most, an optional final
    dot)."""
    if ip_problem(host.strip("[]")) is None:
        return None
    name = host[:-1] if host.endswith(".") else host
    if 0 < len(name) <= 253 and all(_LABEL.match(label) for label in name.split(".")):
        return None
    return f"{host!r} is neither an IP address nor a host name (letters, digits, '-', '_' and '.')"


# Docker's image reference grammar (distribution/reference, regexp.go): [domain[:port]/]path[:tag][@digest], the
# path's components lowercase, joined by ".", "_", "__" or dashes; the tag word characters, "." and "-".
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*)(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def image_ref_problem(ref: str) -> str | None:
    """An image reference Docker and Kubernetes accept (``registry:5000/team/demo:tag``, ``demo@sha256:...``, an
    image id), or why not: a space, an upper-case path, ``::``, a second tag. Checked before anything is written,
    since a reference is copied into compose files, argv and manifests, where a space would split it."""
    m = _REFERENCE.fullmatch(ref)
    if m is None or len(m.group("name")) > 255:
        return (
            f"{ref[:60]!r} is not an image reference (registry/name:tag: lowercase name parts, no spaces, at most "
            "one tag)"
        )
    return None


DOCKER_SCHEMES = ("unix", "tcp", "ssh")


def docker_host_problem(url: str) -> str | None:
    """A Docker endpoint as DOCKER_HOST takes it: ``unix:///path``, ``tcp://host:port`` or ``ssh://[user@]host``
    with a plain host, or why not."""
    bad = text_problem(url)
    if bad is not None or any(c.isspace() for c in url):
        return f"{url[:60]!r} is not a Docker endpoint ({bad or 'it has spaces'})"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError as e:
        return f"{url[:60]!r} is not a Docker endpoint URL ({e})"
    if parts.scheme not in DOCKER_SCHEMES:
        return f"{url[:60]!r} is not a Docker endpoint (unix:///var/run/docker.sock, tcp://host:2376, ssh://me@host)"
    if parts.scheme == "unix":
        ok = not parts.netloc and parts.path.startswith("/")
    else:
        host = parts.hostname or ""
        ok = bool(host) and hostname_problem(host) is None and parts.username != ""
    return None if ok else f"{url[:60]!r} is not a Docker endpoint (a plain host name or socket path)"


# An sbatch option's name: sbatch reads an #SBATCH line itself (src/sbatch/opt.c), splitting it at whitespace and
# taking quotes and backslashes out, so a name with any of them, or a "#" (the rest of the line is a comment), is
# not the one word it looks like: "--exclusive --nodes=1" is two options, the second overriding nodekit's.
_SBATCH_NAME = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*|-[A-Za-z0-9][^\s\"'\\#]*")  # -X may carry its value


def sbatch_option_problem(item: str) -> str | None:
    """Why the ``sbatch_args`` item ``item`` (``--name=value``, ``--flag``, ``-Xvalue``) is not one sbatch option
    whose name reads back as written, or None. The value after ``=`` may hold anything: it is quoted for sbatch (a
    short option's value written without ``=`` is held to the name's plain characters)."""
    name = item.partition("=")[0]
    if _SBATCH_NAME.fullmatch(name):
        return None
    if not name.startswith("-"):
        return f"{item[:60]!r} is not one sbatch option: it does not start with - or --"
    return (
        f"{item[:60]!r} is not one sbatch option: its name before '=' holds whitespace, a quote, a backslash or '#', "
        "which sbatch reads as more than the one option it looks like"
    )


def same_host_key(host: str) -> str:
    """``host`` written one way: lowercase, no final dot, an IP literal in its canonical form, including the IPv4
    spellings the resolver accepts (``10.1``, ``0x0a000001``, ``010.0.0.1``) and IPv4-mapped IPv6. Offline: two
    DNS names for one machine stay two."""
    name = host.strip("[]").lower().rstrip(".")
    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        if re.fullmatch(r"[0-9a-fx.]+", name):
            try:
                return socket.inet_ntoa(socket.inet_aton(name))
            except OSError:
                return name
        return name
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)
