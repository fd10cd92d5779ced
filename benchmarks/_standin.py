"""Stand-in hosts for the head's scale benchmark (benchmarks/scale_bench.py, issue 48): many hosts behind one real
sshd, each answering the docker calls ``nodekit run`` makes, so that what is measured is the head's own fan-out.

One network namespace (``nkscale``) joined to this machine by one veth pair; its end holds one address per stand-in
host (10.77.1.1, 10.77.1.2, ...; this machine's end is 10.77.0.1/16). One sshd listens on every address there. A
session knows the host it plays from ``SSH_CONNECTION`` (its third word: the address the head dialled), and its PATH
starts with :data:`DOCKER_SCRIPT` as ``docker``: it answers the check's ``image inspect``, the start's ``docker run``,
the follower's ``ps``, ``container wait`` and ``logs --follow``, ``rm`` and ``inspect``, from files under the state
directory (one directory per address). The docker CLI's ``ssh://`` transport (``nodekit run``'s ``compose down`` on
the head) runs ``docker system dial-stdio`` there: :data:`DIAL_STDIO` answers the Docker API's few calls that
``compose down`` makes on that stream itself (no container left: the job has ended; networks and volumes none).

The job of every stand-in node ends at one moment the benchmark writes (``end_at``, epoch seconds), or
:data:`MIN_JOB_S` after its own start where that is later, so that every node's follower is alive at once.
The stand-ins' own CPU (sshd's sessions, these scripts) runs on this machine's cores beside the head.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

NETNS = "nkscale"
VETH_HERE, VETH_THERE = "nkscale0", "nkscale1"
HERE_ADDR = "10.77.0.1"
PREFIX_LEN = 16
MIN_JOB_S = 2
RUN_DIR = Path("/run/nkscale")
SSHD = Path("/usr/sbin/sshd")


def addr(i: int) -> str:
    """Stand-in host ``i``'s address (0-based): 10.77.1.1 onwards, 250 per third octet."""
    return f"10.77.{1 + i // 250}.{1 + i % 250}"


def image_json(ref: str) -> dict[str, object]:
    """A ``docker image inspect`` entry for ``ref`` that every stand-in engine and the head's agree on."""
    digest = hashlib.sha256(ref.encode()).hexdigest()
    layers = [f"sha256:{hashlib.sha256(f'{ref}/{i}'.encode()).hexdigest()}" for i in range(6)]
    return {
        "Id": f"sha256:{digest}",
        "RepoTags": [ref],
        "RepoDigests": [],
        "Size": 1_100_000_000,
        "Os": "linux",
        "Architecture": "amd64",
        "Config": {"Env": ["PATH=/opt/venv/bin:/usr/bin:/bin"], "Labels": {"org.nodekit.standin": "1"}},
        "RootFS": {"Type": "layers", "Layers": layers},
    }


# POSIX sh, first on the PATH of every sshd session: the stand-in engine of the host the session plays
# ($NKS_STATE/<address>/). A container is a file named after it: its project, then its end (epoch ns).
DOCKER_SCRIPT = r"""#!/bin/sh
set -u
# No program started for what the shell can do itself (the address, the directory): these sessions' CPU is the
# simulation's, on the cores the head is measured on.
me=${SSH_CONNECTION:-x x local x}; me=${me#* * }; me=${me%% *}
d="$NKS_STATE/$me"
[ -d "$d" ] || mkdir -p "$d"
now_ns() { date +%s%N; }
nap_until() {  # sleep until epoch ns $1
  left=$(( ($1 - $(now_ns)) / 1000000 ))
  [ "$left" -gt 0 ] && sleep "$((left / 1000)).$(printf '%03d' $((left % 1000)))"
  return 0
}
case "${1:-}" in
  image)
    shift; ref=""; for a in "$@"; do ref=$a; done
    if [ "$ref" = "$(cat "$NKS_STATE/ref")" ]; then cat "$NKS_STATE/image.json"; exit 0; fi
    echo "Error response from daemon: No such image: $ref" >&2; exit 1 ;;
  version) echo "27.5.1"; exit 0 ;;
  info) echo '{"runc":{"path":"runc"}}'; exit 0 ;;
  system) shift; [ "${1:-}" = dial-stdio ] && exec python3 "$NKS_BIN/dial_stdio.py"
    echo "stand-in: docker system $*: not answered" >&2; exit 1 ;;
  run)
    shift; name=""; project=""
    for a in "$@"; do
      case $a in
        --name=*) name=${a#--name=} ;;
        --label=com.docker.compose.project=*) project=${a#--label=com.docker.compose.project=} ;;
      esac
    done
    [ -z "$name" ] && [ "${2:-}" != "" ] && [ "$1" = --detach ] && [ "$2" = --name ] && name=$3
    if [ -e "$d/c.$name" ]; then echo "Conflict. The container name \"/$name\" is already in use" >&2; exit 1; fi
    end=$(( $(now_ns) + MIN_JOB_NS )); at=$(( $(cat "$NKS_STATE/end_at") * 1000000000 ))
    [ "$at" -gt "$end" ] && end=$at
    printf '%s %s\n' "$project" "$end" > "$d/c.$name"
    echo "$name"; exit 0 ;;
  ps)
    shift; want=""
    for a in "$@"; do
      case $a in label=com.docker.compose.project=*) want=${a#label=com.docker.compose.project=} ;; esac
    done
    for f in "$d"/c.*; do
      [ -e "$f" ] || continue
      read -r p e < "$f"; [ -z "$want" ] || [ "$p" = "$want" ] && echo "${f##*/c.}"
    done; exit 0 ;;
  stop|rm)
    verb=$1; shift; [ "${1:-}" = --time ] && shift 2; [ "${1:-}" = --force ] && shift
    for c; do
      [ -e "$d/c.$c" ] || { echo "Error response from daemon: No such container: $c" >&2; exit 1; }
      [ "$verb" = rm ] && rm -f "$d/c.$c"
    done; exit 0 ;;
  container|wait|logs|inspect)
    [ "$1" = container ] && shift
    verb=$1; shift; c=""; for a in "$@"; do c=$a; done
    f="$d/c.$c"
    if [ ! -e "$f" ]; then echo "Error response from daemon: No such container: $c" >&2; exit 1; fi
    read -r p e < "$f"
    case $verb in
      wait) nap_until "$e"; echo 0 ;;
      logs) echo "stand-in $me: container $c started"; nap_until "$e"; echo "stand-in $me: | final loss 0.0" ;;
      inspect) echo running ;;
    esac; exit 0 ;;
esac
echo "stand-in docker: $* is not answered here" >&2
exit 1
""".replace("MIN_JOB_NS", str(MIN_JOB_S * 1_000_000_000))

# Python, run by the stand-in's `docker system dial-stdio`: the Docker API on its standard input and output, for the
# calls `docker compose down` makes. Anything else is answered 404 and written to $NKS_STATE/api.log.
DIAL_STDIO = r"""
import json, os, sys
from http.server import BaseHTTPRequestHandler
VERSION = {"Version": "27.5.1", "ApiVersion": "1.47", "MinAPIVersion": "1.24", "Os": "linux", "Arch": "amd64"}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def setup(self):
        self.rfile, self.wfile = sys.stdin.buffer, sys.stdout.buffer
    def finish(self):
        self.wfile.flush()
    def log_message(self, *a):
        pass
    def send(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Api-Version", "1.47")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        if parts and parts[0].startswith("v1."):
            parts = parts[1:]
        what = "/".join(parts)
        if what == "_ping":
            return self.send(200, b"OK", "text/plain")
        if what == "version":
            return self.send(200, VERSION)
        if what == "info":
            return self.send(200, {"ServerVersion": "27.5.1", "OSType": "linux", "Runtimes": {"runc": {}}})
        if what in ("containers/json", "networks", "volumes", "images/json"):
            return self.send(200, {"Volumes": [], "Warnings": []} if what == "volumes" else [])
        with open(os.path.join(os.environ["NKS_STATE"], "api.log"), "a") as f:
            f.write(f"{self.command} {self.path}\n")
        return self.send(404, {"message": "not answered by the stand-in"})
    do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = answer
H(None, ("stdio", 0), None)
"""


def head_docker(real_docker: str, state: Path) -> str:
    """The head's ``docker``: this machine's engine stands in for nobody, so the head's one question of its own
    engine (the run's image, by reference) is answered from the same JSON as the hosts'; every other call (the
    Compose plugin's version, ``compose down`` over ``ssh://``) is the real docker CLI."""
    return (
        "#!/bin/sh\n"
        f'if [ "${{1:-}}" = image ] && [ "${{2:-}}" = inspect ]; then cat {state}/image.json; exit 0; fi\n'
        f'exec {real_docker} "$@"\n'
    )


def sh(*argv: str, check: bool = True, inp: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, input=inp, timeout=60)


class Standins:
    """The namespace, its ``n`` addresses and its sshd (``with``: made, then removed)."""

    def __init__(self, n: int, work: Path, authorized_key: str, host_key: Path) -> None:
        self.n, self.work = n, work
        self.state, self.bin = work / "state", work / "bin"
        self.authorized_key, self.host_key = authorized_key, host_key
        self.sshd_pid: int | None = None
        self.openssh: Path | None = None  # an unpacked openssh-server's root (usr/sbin/sshd, ...); None: the system's

    @property
    def addrs(self) -> list[str]:
        return [addr(i) for i in range(self.n)]

    def __enter__(self) -> Standins:
        self.down()
        self.state.mkdir(parents=True, exist_ok=True)
        self.bin.mkdir(parents=True, exist_ok=True)
        (self.bin / "docker").write_text(DOCKER_SCRIPT)
        (self.bin / "docker").chmod(0o755)
        (self.bin / "dial_stdio.py").write_text(DIAL_STDIO)
        sh("ip", "netns", "add", NETNS)
        sh("ip", "link", "add", VETH_HERE, "type", "veth", "peer", "name", VETH_THERE, "netns", NETNS)
        sh("ip", "addr", "add", f"{HERE_ADDR}/{PREFIX_LEN}", "dev", VETH_HERE)
        sh("ip", "link", "set", VETH_HERE, "up")
        batch = [f"addr add {a}/{PREFIX_LEN} dev {VETH_THERE}" for a in self.addrs]
        sh("ip", "-n", NETNS, "-batch", "-", inp="\n".join([*batch, f"link set {VETH_THERE} up", "link set lo up"]))
        self._sshd()
        return self

    def use_openssh(self, root: Path | None) -> None:
        """The stand-ins' sshd from ``root``, an unpacked openssh-server package (None: the system's), restarted."""
        self._stop_sshd()
        self.openssh = root
        self._sshd()

    def _sshd(self) -> None:
        sshd = SSHD if self.openssh is None else self.openssh / "usr/sbin/sshd"
        # OpenSSH 9.8 and later start each connection's session (and 10.0 its authentication) from a path of their
        # own, which an unpacked package must name.
        helpers = [] if self.openssh is None else [
            f"SshdSessionPath {self.openssh / 'usr/lib/openssh/sshd-session'}",
            *([f"SshdAuthPath {auth}"] if (auth := self.openssh / "usr/lib/openssh/sshd-auth").exists() else []),
        ]  # fmt: skip
        d = self.work / "sshd"
        d.mkdir(exist_ok=True)
        (d / "authorized_keys").write_text(self.authorized_key)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        config = d / "sshd_config"
        config.write_text("\n".join([
            "Port 22", "ListenAddress 0.0.0.0", f"HostKey {self.host_key}", f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            # One sshd plays every host: each would see a handful of the head's connections at once.
            "MaxStartups 4096", "MaxSessions 100",
            f"SetEnv PATH={self.bin}:/usr/local/bin:/usr/bin:/bin NKS_STATE={self.state} NKS_BIN={self.bin}",
            *helpers, "",
        ]))  # fmt: skip
        log = d / "sshd.log"
        # The sessions' home is an empty directory bound over /root (as tests/cluster's hosts have their own): this
        # machine's ~/.bashrc (bash reads it for an SSH command) would cost each session more than the head does.
        home = d / "home"
        home.mkdir(exist_ok=True)
        own_home = ["unshare", "--mount", "--propagation", "private", "--",
                    "sh", "-c", 'mount --bind "$0" /root && exec "$@"', str(home)]  # fmt: skip
        p = subprocess.Popen(["ip", "netns", "exec", NETNS, *own_home, str(sshd), "-D", "-f", str(config), "-E",
                              str(log)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                             start_new_session=True)  # fmt: skip
        self.sshd_pid = p.pid
        deadline = time.monotonic() + 10
        while sh("ip", "netns", "exec", NETNS, "ss", "-Hltn", "sport = :22", check=False).stdout.strip() == "":
            if p.poll() is not None or time.monotonic() > deadline:
                said = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"the stand-ins' sshd did not start: {said}")
            time.sleep(0.05)

    def set_job(self, ref: str, end_at: float) -> None:
        """The image every stand-in engine holds, and when every stand-in node's job ends (epoch seconds)."""
        (self.state / "ref").write_text(ref + "\n")
        (self.state / "image.json").write_text(json.dumps(image_json(ref)) + "\n")
        (self.state / "end_at").write_text(f"{int(end_at)}\n")

    def clear(self) -> None:
        """No container left on any stand-in (between runs)."""
        for d in self.state.iterdir():
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _stop_sshd(self) -> None:
        if self.sshd_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.sshd_pid, 15)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.sshd_pid, 0)
            self.sshd_pid = None

    def down(self) -> None:
        self._stop_sshd()
        # Everything left in the namespace (sessions of a killed run): the namespace is ours alone.
        got = sh("ip", "netns", "pids", NETNS, check=False).stdout.split()
        for pid in got:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        sh("ip", "link", "del", VETH_HERE, check=False)
        sh("ip", "netns", "del", NETNS, check=False)


def pids_under(root: int, skip: Sequence[int] = ()) -> list[int]:
    """``root`` and every live descendant of it (from /proc), not entering ``skip``'s subtrees."""
    children: dict[int, list[int]] = {}
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(e.name))
    return descendants(children, [root], skip)


def descendants(children: Mapping[int, Sequence[int]], roots: Iterable[int], skip: Collection[int] = ()) -> list[int]:
    """``roots`` and every descendant of theirs in ``children`` (a parent's PID: its children's), each once, not
    entering ``skip``'s subtrees."""
    out: list[int] = []
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        p = todo.pop()
        if p in skip or p in seen:
            continue
        seen.add(p)
        out.append(p)
        todo += children.get(p, [])
    return out
