"""One node's job followed from the head to its end: its output line by line, then its exit code, or why the node
was lost.

An ``ssh://`` host is followed in one SSH command (:data:`FOLLOW_SCRIPT`, riding the run's shared connection): the
host's own docker CLI follows the container's log and waits for its exit code beside it. Not two streams per node
(``docker compose logs -f`` and ``docker wait`` through the docker CLI's ``ssh://`` transport), which would be a
docker CLI and a Compose plugin on the head, and a ``docker system dial-stdio`` on the host, per stream, for the
whole job: about 95 MB of memory on the head per node (a docker CLI is 24 MB, the Compose plugin 48), and CPU at
the start, where every host's start shares the head's cores with the job's. The head holds one ``ssh`` client per
node.

A node is lost when its connection is: the shared connection keeps alive at the job's interval
(nodekit/backends/fleet/alive.py), and a host that stops answering ends the command within it (ssh's 255). An engine
that stops answering ends it too: the exit code's question fails there. Other endpoints (``unix://``, ``tcp://``)
follow the log and wait beside it through this machine's docker CLI, as before.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodekit.backends.fleet import remote
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import EngineError
from nodekit.system import docker
from nodekit.system.docker.calls import ENGINE_FIX, stderr_tail
from nodekit.system.docker.compose import JobOutput

# POSIX sh, run by the host's login over SSH: the compose project's container (by Compose's labels, whatever its
# name); its exit code asked beside its log, as `docker wait` was beside `compose logs -f` (the code is known when the
# container stops, before a `down` removes it), written on standard error; its log on standard output (the job's
# standard error merged, as `docker compose logs` merges it). The command ends when both have.
FOLLOW_SCRIPT = r"""
c=$(docker ps --all --quiet --filter "label=com.docker.compose.project=$NK_PROJECT" \
      --filter "label=com.docker.compose.service=$NK_SERVICE" 2>&1) || { printf 'nk-lost=%s\n' "$c" >&2; exit 0; }
c=$(printf '%s\n' "$c" | sed -n 1p)
[ -n "$c" ] || { printf 'nk-lost=compose project %s has no container\n' "$NK_PROJECT" >&2; exit 0; }
( code=$(docker container wait "$c" 2>&1); printf 'nk-exit=%s\n' "$code" >&2 ) &
docker logs --follow "$c" 2>&1
wait
"""

_EXIT = re.compile(r"^nk-exit=(-?\d+)\s*$", re.M)
_LOST = re.compile(r"^nk-(?:exit|lost)=(.*)$", re.M)

LineFn = Callable[[str], object]


def follow_script(project: str, service: str) -> str:
    return f"NK_PROJECT={shlex.quote(project)}\nNK_SERVICE={shlex.quote(service)}\n{FOLLOW_SCRIPT}"


def exit_code_of(returncode: int, stderr: str) -> int | str:
    """Pure: the job's exit code from :data:`FOLLOW_SCRIPT`'s SSH command (its return code and standard error), or
    why the node was lost (a string)."""
    if returncode == 0 and (codes := _EXIT.findall(stderr)):
        return int(codes[-1])
    said = _LOST.findall(stderr)
    if returncode == 0 and said:
        return f"its engine did not answer: {said[-1].strip() or 'no message'}"
    why = stderr_tail("\n".join(ln for ln in stderr.splitlines() if not ln.startswith("nk-")))
    if returncode == 255:
        return f"the SSH connection ended: {why}"
    return f"following its job failed (exit {returncode}): {why}"


def follow(host: FleetHost, compose_file: Path, project: str, service: str, on_line: LineFn) -> int:
    """Follow the node's job on ``host``: each line of its output to ``on_line``, then its exit code. EngineError
    when the node is lost (its connection or its engine) before the job's end was known."""
    if host.scheme != "ssh":
        return _follow_engine(host.url, compose_file, project, service, on_line)
    out = JobOutput(remote.ssh_argv(host, follow_script(project, service)), what=f"following {project} on {host.where}")
    for line in out:
        on_line(line)
    got = exit_code_of(out.returncode, out.stderr())
    if isinstance(got, int):
        return got
    raise EngineError(f"lost {host.where} while following {project}: {got}", fix=ENGINE_FIX)


def _follow_engine(url: str, compose_file: Path, project: str, service: str, on_line: LineFn) -> int:
    """Through the docker CLI: the exit code waited for beside the log (so it is known before a ``down`` removes the
    container), the log followed to its end."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nodekit-wait") as pool:
        code = pool.submit(docker.compose_wait, compose_file, project, service=service, host=url)
        try:
            for line in docker.compose_logs(compose_file, project, follow=True, host=url):
                on_line(line)
        except EngineError:
            pass  # the waiter says what happened to the node
        return code.result()
