"""One node's container stopped (and removed) by its host's own docker CLI, in one SSH command on the run's shared
connection: the end of every ``ssh://`` node that :mod:`nodekit.backends.fleet.start` started.

``docker compose down`` through the docker CLI's ``ssh://`` transport would cost, per node, a docker CLI and the
Compose plugin on the head (about 0.1 CPU s and 70 MB resident together, measured against stand-in hosts:
benchmarks/scale_bench.py, docs/scale.md) and a ``docker system dial-stdio`` on the host; a run's end stops up to
64 nodes at once, so the head would hold 64 of each. Here the head holds one ``ssh`` client per node. The host does
what ``compose down`` does for a node started by ``docker run``: every container of the node's Compose project (found
by Compose's own label, as ``--remove-orphans`` finds them) stopped within the timeout, then removed; with ``keep``
(``keep_containers``: ``compose stop``) stopped only. Such a node has no network of its own to remove (a host
network). ``nodekit down`` by hand still goes through Compose.
"""

from __future__ import annotations

import shlex

from nodekit.backends.compose.node import NodePlan
from nodekit.backends.fleet import remote, start
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import DeadlineError, EngineError
from nodekit.system import docker, proc
from nodekit.system.docker import calls

FILES_PER_NODE = 4
"""Open files ``nodekit run`` may hold per node: until its check, its opening's three pipes (every host's at once:
fleet/remote.py's ``opening``), then for the whole job its follower's two, with room to spare (the head process held
164 at 64 stand-in hosts with every follower alive, 1,404 to 1,508 at 512: benchmarks/scale_bench.py); and per host
in flight, a start's three pipes, up to MAX_PARALLEL at once."""
FILES_BASE = 256


def open_files(nodes: int) -> int:
    """Open files ``nodekit run`` on ``nodes`` nodes needs (nodekit/system/fdlimit.py raises the limit to it)."""
    return FILES_BASE + FILES_PER_NODE * nodes + 3 * remote.MAX_PARALLEL


# POSIX sh, run by the host's login after NK_PROJECT, NK_TIMEOUT and NK_KEEP: the project's containers by Compose's
# label, stopped (SIGTERM, then SIGKILL after NK_TIMEOUT s, as compose does), then removed unless kept. The removal
# does not depend on the stop: a stop that fails (an engine under load that missed the exit event, another end of
# the same run removing it first) still ends in `rm --force`, which kills what runs. Docker's own message goes to
# standard error; none there is no failure (nothing left to stop).
STOP_SCRIPT = r"""
c=$(docker ps --all --quiet --filter "label=com.docker.compose.project=$NK_PROJECT" 2>&1) || {
  printf '%s\n' "$c" >&2; exit 1; }
[ -n "$c" ] || exit 0
docker stop --time "$NK_TIMEOUT" $c >/dev/null; stopped=$?
[ "$NK_KEEP" = 1 ] && exit $stopped
left=$(docker ps --all --quiet --filter "label=com.docker.compose.project=$NK_PROJECT")
[ -z "$left" ] || docker rm --force $left >/dev/null
"""


def stop_script(project: str, timeout: int, *, keep: bool = False) -> str:
    return f"NK_PROJECT={shlex.quote(project)}\nNK_TIMEOUT={int(timeout)}\nNK_KEEP={int(keep)}\n{STOP_SCRIPT}"


def stop(host: FleetHost, project: str, *, timeout: int, keep: bool = False) -> None:
    """Stop every container of ``project`` on ``host`` (an ``ssh://`` host) and remove it unless ``keep``; EngineError
    when the host or its engine could not be made to (a lost host: its container may still run there)."""
    verb = "stop" if keep else "down"
    what = f"stopping {project} on {host.where}"
    fix = f"docker compose -p {project} {verb} (on {host.hostname})"
    try:
        done = proc.run(remote.ssh_argv(host, stop_script(project, timeout, keep=keep)),
                        deadline=timeout + calls.ENGINE_CALL_S, what=what, fix=fix, stdin="devnull")  # fmt: skip
    except DeadlineError as e:
        raise EngineError(f"{what} did not end: {e.message}", fix=fix) from e
    if done.returncode == 255:
        problem = remote.ssh_problem(host, done.stderr)
        raise EngineError(f"{what} failed: {problem.what}", fix=problem.fix)
    if done.returncode != 0:
        raise EngineError(f"{what} failed: {calls.stderr_tail(done.stderr)}", fix=fix)


def end(host: FleetHost, plan: NodePlan, *, timeout: int, keep: bool = False) -> None:
    """The end of one node of a run: :func:`stop` where its host's ``docker run`` started it, else ``compose down``
    (``compose stop`` with ``keep``) through the docker CLI."""
    if host.scheme == "ssh" and start.startable(plan.container):
        stop(host, plan.project, timeout=timeout, keep=keep)
    else:
        (docker.compose_stop if keep else docker.compose_down)(plan.compose_path, plan.project, timeout=timeout,
                                                               host=host.url)  # fmt: skip
