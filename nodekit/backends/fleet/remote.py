"""Each host's checks and facts, gathered there through the user's own OpenSSH client (``ssh`` on PATH, with the
user's config, keys, agent, ProxyJump and known_hosts) and through the host's Docker engine. Nothing is installed.
The facts are the ones ``nodekit up`` reads on its own host, by the same script (nodekit/system/host/facts.py).

An ``ssh://`` host is checked in one SSH command (:func:`check_script`): its facts, then its engine through the
host's own docker CLI (the engine the job's ``ssh://`` calls reach: they run ``docker system dial-stdio`` in the same
login), asked for the run's image, whose answer also proves the engine answers, and for its runtimes where GPUs are
expected or found. One command, not three round trips per host (the facts script, ``docker version`` through
``dial-stdio``, ``docker image inspect`` through it), because it is on the path of every ``nodekit run``. In a run
that command is the one that opened the host's connection (:func:`opening`): ``ssh HOST sh -s``, started while this
machine picks the image, whose shell there runs the check once its script is written (:meth:`Opening.ask`).

:func:`check_all` runs every host at once and raises one :class:`FleetCheckError` naming each failing host with its
fix; nothing has been started anywhere when it does. The parsers are pure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import DeadlineError, NodekitError
from nodekit.system import docker, proc, ssh
from nodekit.system.docker.models import ImageInfo, image_info_of
from nodekit.system.host import facts as host_facts
from nodekit.system.host.facts import Gathered, HostFacts, facts_script, parse_facts

SSH_TIMEOUT_S = 8
# The connection, then the facts script there (nvidia-smi within its own deadline, a few file reads).
SSH_DEADLINE_S = SSH_TIMEOUT_S + host_facts.NVIDIA_SMI_S + host_facts.SCRIPT_S
ENGINE_S = 60.0
"""Each docker call of a host's check, there: a healthy engine answers in well under a second, a loaded one in a few;
this long means it hung. The check makes at most two (the image, then the version or the runtimes)."""
CHECK_DEADLINE_S = SSH_DEADLINE_S + 2 * ENGINE_S
MAX_PARALLEL = 64  # sshd's default MaxStartups is 10:30:100 per target; the head's own fan-out is what this bounds


class FleetCheckError(NodekitError):
    """One or more hosts failed their checks; nothing was started anywhere."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    host: FleetHost
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.host.name}: {self.what}. Fix: {self.fix}"


def ssh_argv(host: FleetHost, command: str) -> list[str]:
    """The ``ssh`` command line for ``command`` on ``host``: batch mode (a missing key fails instead of prompting)."""
    return ssh.command(host.hostname, command, port=host.port, user=host.user, connect_timeout=SSH_TIMEOUT_S)


def ssh_problem(host: FleetHost, stderr: str) -> Problem:
    """What an ssh failure means, and its fix, from OpenSSH's own last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else "ssh failed"
    low = stderr.lower()
    target = host.target
    if "host key verification failed" in low or "remote host identification has changed" in low:
        fix = f"ssh {target} once by hand to check and accept its host key (known_hosts)"
    elif "permission denied" in low:
        fix = f"ssh-copy-id {target} (or add your key to its authorized_keys / your ssh-agent)"
    elif "could not resolve" in low:
        fix = "check the host name in hosts (or add it to ~/.ssh/config)"
    else:
        fix = f"check that {shlex.quote(host.hostname)} is up and runs sshd (ssh {target} true)"
    return Problem(host, f"SSH to {target} failed: {last}", fix)


# POSIX sh, after the facts script in the same SSH command (:func:`check_script`): what the host's engine says, as
# key=value lines. The image's own JSON (one line) proves the engine answers; "No such image" is an answer too.
# Where the image is not asked, or the answer is an error, ``docker version`` tells whether the engine answers at all.
# Each docker call is bounded by $NK_ENGINE_S where timeout(1) exists (as nvidia-smi is in the facts script).
ENGINE_SCRIPT = r"""
last() { sed '/^[[:space:]]*$/d' | tail -n 1; }
ask() { said=$($t docker "$@" 2>&1); rc=$?; return $rc; }
if ! command -v docker >/dev/null 2>&1; then
  echo "engine=absent"
else
  t=""; command -v timeout >/dev/null 2>&1 && t="timeout -s KILL $NK_ENGINE_S"
  state=""
  if [ -n "$NK_IMAGE" ]; then
    ask image inspect --format '{{json .}}' "$NK_IMAGE"
    case $rc:$said in
      0:*) state=ok; printf 'image=%s\n' "$said" ;;
      124:*|137:*) state=hung ;;
      *"No such image"*|*"no such image"*) state=ok; echo "image=none" ;;
      *) printf 'image_error=%s\n' "$(printf '%s\n' "$said" | last)" ;;
    esac
  fi
  if [ -z "$state" ]; then
    ask version --format '{{.Server.Version}}'
    case $rc in
      0) state=ok ;;
      124|137) state=hung ;;
      *) state=error; printf 'engine_error=%s\n' "$(printf '%s\n' "$said" | last)" ;;
    esac
  fi
  [ "$state" = error ] || echo "engine=$state"
  gpu=$NK_RUNTIMES
  [ -z "$gpu" ] && printf '%s\n' "$facts" | grep -q '^gpu=' && gpu=1
  if [ "$state" = ok ] && [ "$gpu" = 1 ]; then
    ask info --format '{{json .Runtimes}}' && printf 'runtimes=%s\n' "$said"
  fi
fi
exit 0
"""


def check_script(paths: Sequence[str] = (), *, image: str = "", runtimes: bool | None = None) -> str:
    """One ``ssh://`` host's whole check, for one SSH command: :func:`facts_script` (``paths``: the node's mount
    sources), then :data:`ENGINE_SCRIPT` asking for ``image`` ("" for none) and for the engine's runtimes (``runtimes``
    None: where the facts found a GPU)."""
    ask = "" if runtimes is None else str(int(runtimes))
    return (
        f"nk_facts() {{\n{facts_script(paths)}}}\nfacts=$(nk_facts)\nprintf '%s\\n' \"$facts\"\n"
        f"NK_IMAGE={shlex.quote(image)}\nNK_RUNTIMES={ask}\nNK_ENGINE_S={ENGINE_S:g}\n{ENGINE_SCRIPT}"
    )


EngineState = Literal["ok", "absent", "hung", "error"]
_STATES: dict[str, EngineState] = {"ok": "ok", "absent": "absent", "hung": "hung"}


@dataclass(frozen=True)
class EngineSaid:
    """What a host's engine said in its check (:data:`ENGINE_SCRIPT`'s lines)."""

    state: EngineState = "ok"  # absent: no docker CLI there
    error: str = ""  # the engine's own last line, when state is "error"
    image: ImageInfo | None = None  # the asked image as that engine reports it; None: not there, or not known
    image_known: bool = False  # the engine said whether it has the image
    runtimes: tuple[str, ...] | None = None  # None: not asked, or not answered
    fix: str = ""  # the docker CLI's own fix, where it diagnosed the failure (a host reached without SSH)


def parse_engine(text: str) -> EngineSaid:
    """Pure: :data:`ENGINE_SCRIPT`'s lines as data (other lines, the facts', are skipped). An answer that does not
    parse (cut short) is no answer: the image is then not known, and the ship path surveys that host."""
    state: EngineState = "error"
    error, image, known, runtimes = "no answer", None, False, None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "engine":
            state, error = _STATES.get(value, "error"), "" if value in _STATES else value
        elif key == "engine_error":
            state, error = "error", value.strip() or "no message"
        elif key == "image":
            try:
                image, known = (None if value == "none" else image_info_of(json.loads(value))), True
            except (ValueError, TypeError, AttributeError):
                image, known = None, False
        elif key == "runtimes":
            try:
                runtimes = tuple(sorted(json.loads(value) or {}))
            except (ValueError, TypeError):
                runtimes = None
    return EngineSaid(state=state, error=error, image=image, image_known=known, runtimes=runtimes)


@dataclass(frozen=True)
class HostReport:
    """A host that passed its check: its facts, and what its engine said of the run's image."""

    gathered: Gathered
    image: ImageInfo | None = None
    image_known: bool = False


def _run_ssh(host: FleetHost, script: str, deadline: float) -> str | Problem:
    """``script`` run by ``host``'s login over SSH within ``deadline``: its standard output, or why not."""
    if shutil.which("ssh") is None:
        return Problem(
            host, "no ssh client on this machine", "install OpenSSH's client (apt-get install openssh-client)"
        )
    fix = f"check that {host.hostname} is up (ssh {host.hostname})"
    try:
        done = proc.run(ssh_argv(host, script), deadline=deadline, what="SSH", fix=fix)
    except DeadlineError:
        return Problem(host, f"SSH did not answer within {deadline:g} s", fix)
    return _said(host, done.returncode, done.stdout, done.stderr)


def _said(host: FleetHost, code: int | None, stdout: str, stderr: str) -> str | Problem:
    """A host's script's standard output, or why not: ssh's own failure (255) named by its last line."""
    if code == 255:
        return ssh_problem(host, stderr)
    if code != 0:
        return Problem(host, f"the facts script failed there ({stderr.strip()[-200:]})", "check its login shell")
    return stdout


def _facts(host: FleetHost, out: str, gpus: int | None) -> Gathered | Problem:
    got = parse_facts(out, gpus)
    if got.nvidia_smi_hung:
        return Problem(host, f"nvidia-smi did not answer within {host_facts.NVIDIA_SMI_S:g} s", host_facts.NVIDIA_FIX)
    return got


def gather(host: FleetHost, gpus: int | None = None, paths: Sequence[str] = ()) -> Gathered | Problem:
    """Facts of ``host``: over SSH for ``ssh://``, here for ``unix://``, from the config alone for ``tcp://``."""
    if host.scheme == "unix":
        here = host_facts.gather()
        return Gathered(
            facts=here if gpus is None else here.model_copy(update={"gpu_count": gpus}),
            absent=frozenset(p for p in paths if not os.path.exists(p)),
            addresses=host_facts.addresses_here(),
        )
    if host.scheme == "tcp":
        return Gathered(facts=HostFacts(gpu_count=gpus or 0))
    out = _run_ssh(host, facts_script(paths), SSH_DEADLINE_S)
    return out if isinstance(out, Problem) else _facts(host, out, gpus)


@dataclass(frozen=True)
class Expect:
    """What the job needs of one host."""

    gpus: bool = False
    ports: tuple[int, ...] = ()
    paths: tuple[str, ...] = ()  # host paths the node's mounts need
    image: str = ""  # the image the node runs: asked of its engine in the same check ("" for none)


OPEN_COMMAND = "sh -s"
"""What :func:`opening`'s SSH command runs there: a shell that waits for its script on standard input, which is the
host's check once this machine knows what to ask (:meth:`Opening.ask`)."""


def _on_stdin(script: str) -> bytes:
    """``script`` as ``sh -s`` reads it: one brace group, which the shell reads whole before it runs any of it, and
    whose commands read nothing of the rest (standard input /dev/null)."""
    return f"{{\n{script}\n}} </dev/null\n".encode()


class Opening:
    """One host's connection being opened by :func:`opening`: ``ssh HOST sh -s``, whose shell there runs the host's
    check once :meth:`ask` writes it."""

    def __init__(self, host: FleetHost, child: proc.Child) -> None:
        self.host, self.child = host, child
        self._asked = False

    def ask(self, script: str, deadline: float) -> str | Problem:
        """``script`` run there by the shell this connection opened, within ``deadline`` seconds from now (the
        connection's own opening included, where it is still under way): its standard output, or why not, as
        :func:`_run_ssh` says it. Once: the shell ends with the script."""
        if self._asked:
            raise RuntimeError(f"{self.host.name}'s opening ran its script already")
        self._asked = True
        fix = f"check that {self.host.hostname} is up (ssh {self.host.hostname})"
        try:
            out, err = self.child.communicate(_on_stdin(script), deadline)
        except DeadlineError:
            return Problem(self.host, f"SSH did not answer within {deadline:g} s", fix)
        return _said(self.host, self.child.returncode, out, err)

    def end(self) -> None:
        self.child.wait_or_kill(0)
        for pipe in (self.child.stdin, self.child.stdout, self.child.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


@contextlib.contextmanager
def opening(hosts: Sequence[FleetHost]) -> Iterator[Mapping[int, Opening]]:
    """While entered, each ``ssh://`` host's connection is being opened (``ssh HOST sh -s``, which becomes the
    connection a :class:`nodekit.ship.SharedSsh` around it shares): the key exchange and login happen while the
    caller does what needs no host (``nodekit run`` picks this machine's image), and the host's check
    (:func:`check_all` with ``opened``) is then the script of that same SSH command (:meth:`Opening.ask`): one
    ``ssh`` and one session per host, not a second ``ssh`` for the check once the first has ended. Yields them by
    rank; on the way out, any still open is ended (its shell there ends with its standard input)."""
    opened: dict[int, Opening] = {}
    if shutil.which("ssh", path=proc.environ().get("PATH")) is not None:
        for h in hosts:
            if h.scheme == "ssh":
                with contextlib.suppress(OSError):
                    waits = proc.Unbounded("the check's deadline, from when Opening.ask writes its script")
                    child = proc.start(ssh_argv(h, OPEN_COMMAND), deadline=waits, what="SSH", fix="", stdin="pipe",
                                       stdout="pipe", stderr="pipe")  # fmt: skip
                    opened[h.rank] = Opening(h, child)
    try:
        yield opened
    finally:
        for o in opened.values():
            o.end()


def _asked(
    host: FleetHost, expect: Expect, gpus: int | None, opened: Opening | None = None
) -> tuple[Gathered, EngineSaid] | Problem:
    """``host``'s facts and what its engine said: in one SSH command for ``ssh://`` (:func:`check_script`), on the
    connection ``opened`` opened when it did; for ``unix://`` and ``tcp://``, the facts as :func:`gather` finds them
    and the engine through the docker CLI."""
    if host.scheme != "ssh":
        got = gather(host, gpus, expect.paths)
        return got if isinstance(got, Problem) else (got, _engine_said(host, expect, got))
    ask_runtimes = True if expect.gpus or gpus else (False if gpus == 0 else None)
    script = check_script(expect.paths, image=expect.image, runtimes=ask_runtimes)
    out = opened.ask(script, CHECK_DEADLINE_S) if opened is not None else _run_ssh(host, script, CHECK_DEADLINE_S)
    if isinstance(out, Problem):
        return out
    facts = _facts(host, out, gpus)
    return facts if isinstance(facts, Problem) else (facts, parse_engine(out))


def _engine_said(host: FleetHost, expect: Expect, got: Gathered) -> EngineSaid:
    """What :data:`ENGINE_SCRIPT` finds, through the docker CLI's own transport (a host reached without SSH)."""
    try:
        docker.check_engine(host.url, buildx=False)  # nodes run images, they build none
        runtimes = docker.runtimes(host.url) if expect.gpus or got.facts.gpu_count > 0 else None
    except NodekitError as e:
        return EngineSaid(state="error", error=e.message, fix=e.fix or docker.ENGINE_FIX)
    if not expect.image:
        return EngineSaid(runtimes=runtimes)
    try:
        return EngineSaid(image=docker.image_info(expect.image, host.url), image_known=True, runtimes=runtimes)
    except NodekitError:
        return EngineSaid(runtimes=runtimes)  # not known: the ship path surveys that host and says why


def _engine_problem(host: FleetHost, said: EngineSaid) -> Problem | None:
    if said.state == "ok":
        return None
    if said.state == "absent":
        return Problem(host, "the docker command-line client is not installed there", docker.ENGINE_FIX)
    if said.state == "hung":
        return Problem(host, f"its Docker engine did not answer within {ENGINE_S:g} s", docker.hung_fix(host.url))
    if said.fix:  # the docker CLI's own diagnosis (check_engine)
        return Problem(host, said.error, said.fix)
    return Problem(host, docker.no_engine_line(host.url, said.error), docker.ENGINE_FIX)


def check_host(
    host: FleetHost, expect: Expect, gpus: int | None, opened: Opening | None = None
) -> HostReport | list[Problem]:
    """Reachable, an engine that answers, GPUs and NVIDIA runtime where expected, free ports (main), the mount
    sources: the host's facts and what its engine said of ``expect.image``, or every reason it fails. ``opened``:
    :func:`opening`'s connection to it."""
    asked = _asked(host, expect, gpus, opened)
    if isinstance(asked, Problem):
        return [asked]
    got, said = asked
    problems = [
        Problem(host, f"mount source {p} does not exist there", f"create it there, or set [nodes.{host.rank}] mounts")
        for p in sorted(got.absent)
    ]
    if (engine := _engine_problem(host, said)) is not None:
        return [*problems, engine]
    if expect.gpus or got.facts.gpu_count > 0:
        if got.facts.gpu_count == 0:
            problems.append(Problem(host, "no NVIDIA GPU found", "check nvidia-smi there, or set [nodes.R] gpus = 0"))
        elif said.runtimes is None:
            problems.append(
                Problem(host, "its engine did not list its runtimes (docker info failed)", docker.hung_fix(host.url))
            )
        elif "nvidia" not in said.runtimes:
            problems.append(
                Problem(host, "the engine has no NVIDIA runtime", "install nvidia-container-toolkit and restart docker")
            )
    if host.scheme == "unix":
        from nodekit.system.host import net

        busy = [p for p in expect.ports if net.port_in_use(p)]
    else:
        busy = sorted(set(expect.ports) & got.listening)
    if busy:
        problems.append(
            Problem(
                host,
                f"port(s) {', '.join(map(str, busy))} on main are already in use",
                "nodekit down (an earlier run), or set another master_port",
            )
        )
    return problems or HostReport(gathered=got, image=said.image, image_known=said.image_known)


def check_all(
    hosts: Sequence[FleetHost],
    expect: Callable[[FleetHost], Expect],
    gpus: Callable[[FleetHost], int | None],
    on_done: Callable[[FleetHost, str | None], None] | None = None,
    opened: Mapping[int, Opening] | None = None,
) -> list[HostReport]:
    """:func:`check_host` on every host in parallel, and this machine's Compose plugin (it starts every ``ssh://``
    host's containers) once beside them: their reports in rank order, or FleetCheckError naming every failing host
    with its fix (EngineError when Compose is what is missing here)."""

    def one(h: FleetHost) -> HostReport | list[Problem]:
        result = check_host(h, expect(h), gpus(h), (opened or {}).get(h.rank))
        if on_done is not None:
            on_done(h, None if isinstance(result, HostReport) else "; ".join(p.what for p in result))
        return result

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, max(1, len(hosts))) + 1) as pool:
        compose = pool.submit(docker.compose_version) if any(h.scheme == "ssh" for h in hosts) else None
        results = list(pool.map(one, hosts))
        if compose is not None:
            compose.result()  # EngineError, one line, when this machine's docker CLI has no Compose v2
    problems = [p for r in results if not isinstance(r, HostReport) for p in r]
    if problems:
        names = ", ".join(dict.fromkeys(p.host.name for p in problems))
        raise FleetCheckError(
            f"{len(dict.fromkeys(p.host.rank for p in problems))} of {len(hosts)} host(s) failed the checks, nothing "
            f"was started: " + " | ".join(p.line() for p in problems),
            fix=f"fix {names} and run again",
        )
    return [r for r in results if isinstance(r, HostReport)]
