"""How the head dials each node of a relay tree: the hop for a target as the head's own OpenSSH sees it (its
``ssh -G`` for the endpoint, so ``~/.ssh/config`` applies) with the host key lines the head's known_hosts files hold
for it, which the feeding node then accepts and no other (:mod:`nodekit.ship.relay`)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from nodekit.errors import DeadlineError
from nodekit.ship.hopkeys import Hop
from nodekit.system import proc, ssh


def parse_ssh_config(text: str) -> dict[str, list[str]]:
    """``ssh -G`` output: lower-case keyword to its values (identityfile and a few others repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


def host_key_name(hostname: str, port: int, alias: str | None) -> str:
    """The name ssh looks a host up by in known_hosts: the HostKeyAlias as is, else ``host`` on port 22 and
    ``[host]:port`` on any other (OpenSSH's put_host_port)."""
    if alias:
        return alias
    return hostname if port == 22 else f"[{hostname}]:{port}"


def known_lines(found: str) -> str:
    """The key lines of ``ssh-keygen -F`` output (its ``# Host ... found`` comments dropped)."""
    return "".join(ln + "\n" for ln in found.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


def _expand(path: str, home: str) -> str:
    return home + path[1:] if path.startswith("~") else path


def hop_of(name: str, endpoint: str, env: Mapping[str, str] | None = None) -> Hop | str:
    """The hop for the target ``endpoint`` as the head's own OpenSSH sees it, or why it cannot be relayed to."""
    parts = urlsplit(endpoint)
    if parts.scheme != "ssh" or not parts.hostname:
        return "not an ssh:// endpoint"
    real, keygen = shutil.which("ssh", path=(env or proc.environ()).get("PATH")), shutil.which("ssh-keygen")
    if real is None or keygen is None:
        return "no ssh or ssh-keygen on this machine"
    argv = ssh.config_of(real, parts.hostname, user=parts.username, port=parts.port)
    try:
        got = proc.run(argv, deadline=10, what="ssh -G", fix="", env=env)
    except (OSError, DeadlineError) as e:
        return f"ssh -G failed: {e}"
    if got.returncode != 0:
        return f"ssh -G failed: {got.stderr.strip()[-200:]}"
    cfg = parse_ssh_config(got.stdout)

    def one(key: str, default: str = "") -> str:
        return (cfg.get(key) or [default])[0]

    for key in ("proxyjump", "proxycommand"):
        if one(key, "none") != "none":
            return f"reached through {key} (its node may not reach it directly)"
    hostname, port = one("hostname", parts.hostname), int(one("port", "22"))
    alias = one("hostkeyalias", "none")
    lookup = host_key_name(hostname, port, None if alias == "none" else alias)
    home = str(Path.home())
    files = [_expand(f, home) for key in ("userknownhostsfile", "globalknownhostsfile")
             for v in cfg.get(key, []) for f in v.split()]  # fmt: skip
    lines = ""
    for f in files:
        if Path(f).is_file():
            found = proc.run(ssh.known_hosts_lookup(keygen, lookup, f), deadline=10, what="ssh-keygen -F",
                             fix="check that file (ssh-keygen -F HOST -f FILE)")  # fmt: skip
            lines += known_lines(found.stdout)
    if not lines:
        return f"the head has no host key for {lookup} in {' '.join(files) or 'its known_hosts'}"
    return Hop(name=name, endpoint=endpoint, user=one("user"), hostname=hostname, port=port, alias=lookup,
               known_hosts=lines)  # fmt: skip
