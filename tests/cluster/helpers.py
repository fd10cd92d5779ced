"""Plain helpers of the cluster tests (no fixtures: those are in conftest.py): the CLI's argv, the demo project and
its image, the fleet over real SSH, small images for the push tests, and waiting on a ``nodekit run``.

Shared by several test modules, so that no test module imports another (tests/unit/meta/test_test_imports.py).
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks._shipnet import tx_bytes
from nodekit.job import secret
from tests.cluster.harness import Cluster, Host, pids_in_netns, sh, ssh_client
from tests.factories import copy_checkout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp"
NODEKIT = [sys.executable, "-m", "nodekit"]


# A host killed with its processes: the kernel ends their connections with a FIN, or with a reset where a heartbeat
# was still unread (on a loaded machine); main's store names the first "closed", the second "cut", confirmed by the
# heartbeat's silence. Either way the node is named within seconds, not after NODEKIT_PEER_TIMEOUT.
CLOSED_OR_CUT = (
    r"store connection (closed without a done mark \(the launcher ended: its container killed or stopped\)"
    r"|broke and the heartbeat stopped); "
)


def nodekit_argv(*args: str) -> list[str]:
    """The real CLI, as a user runs it."""
    return [*NODEKIT, *args]


@dataclass(frozen=True)
class Demo:
    """examples/ddp, copied and built on the default engine; ``ref`` is its image."""

    project: Path
    ref: str
    image_id: str


def push_image(ref: str, source: str | None, hosts: list[Host]) -> None:
    """nodekit push through its Python API (the CLI is tested on its own): skips hosts that have the image."""
    from nodekit import ship
    from nodekit.system.progress import NullReporter

    src = ship.source_of(ref, source)
    targets = [ship.Target(name=h.name, endpoint=h.docker_host) for h in hosts]
    ship.push(ship.plan_push(src, ship.survey(src, targets)), NullReporter())


def host_project(demo: Demo, host: Host, base: Path) -> Path:
    """The demo project as this host's own checkout (each machine has its own files, outputs and compose dir)."""
    dest = base / host.name / "ddp"
    # The job secret travels with the project (.nodekit/job-secret), as a user's copy to each machine carries it.
    secret.load_or_create(demo.project)
    return copy_checkout(demo.project, dest)


# --- the fleet: real SSH, an OpenSSH server in every host ---------------------------------------------------------


@dataclass(frozen=True)
class SshKeys:
    dir: Path
    host_key: Path
    client_key: Path
    wrong_key: Path

    def public(self, key: Path) -> str:
        return key.with_suffix(".pub").read_text()


@dataclass
class Fleet:
    """The cluster with an sshd on every host, and the head's OpenSSH set up for it: ``env`` puts an ``ssh`` first
    on PATH that reads the test's ssh_config (IdentityFile, UserKnownHostsFile, StrictHostKeyChecking), as a user's
    own ~/.ssh/config would; nodekit and the docker CLI (its ssh:// transport) both run that ``ssh``."""

    cluster: Cluster
    keys: SshKeys
    config: Path
    bin: Path

    def url(self, host: Host, user: str = "root") -> str:
        return f"ssh://{user}@{host.addr}"

    @property
    def env(self) -> dict[str, str]:
        # No user ssh-agent, as in CI: a relay chain then logs in through the private agent nodekit starts.
        return {"PATH": f"{self.bin}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": ""}

    def project(self, demo: Demo, base: Path, *, hosts: list[str] | None = None, **settings: object) -> Path:
        """The demo project, checked out on the head (host 0), with ``hosts`` and ``settings`` in its nodekit.toml."""
        dest = host_project(demo, self.cluster.main, base)
        urls = hosts if hosts is not None else [self.url(h) for h in self.cluster.hosts]
        extra = {"hosts": urls, "nnodes": len(urls), **settings}
        toml = (dest / "nodekit.toml").read_text()
        lines = [ln for ln in toml.splitlines() if not ln.startswith(tuple(f"{k} =" for k in extra))]
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
        (dest / "nodekit.toml").write_text("\n".join(lines) + "\n")
        return dest

    def run(self, project: Path, *args: str, log: Path) -> subprocess.Popen[str]:
        """``nodekit run`` on the head (host 0), as a user there would type it."""
        argv = nodekit_argv("run", "--config", str(project / "nodekit.toml"), *args)
        return self.cluster.main.popen(*argv, env=self.env, cwd=project, log=log)

    def nodekit(self, project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = nodekit_argv(*args, "--config", str(project / "nodekit.toml"))
        return self.cluster.main.run(*argv, env=self.env, cwd=project, timeout=timeout)


# --- pushing images: small random ones, the head's link, the relay's traces ----------------------------------------

REF = "nodekit/shiptest:current"


def make_image(host: Host, ref: str, *, seed: int, mib: int = 8) -> str:
    """A one-layer image of ``mib`` MiB of (incompressible) random bytes, imported into ``host``'s engine."""
    rnd = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("etc/seed", str(seed).encode()), ("data/blob", rnd.randbytes(mib << 20))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    proc = subprocess.run(
        ["docker", "-H", host.docker_host, "import", "-", ref], input=buf.getvalue(), capture_output=True
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode().strip()


def ids(host: Host) -> set[str]:
    return set(host.docker("images", "-q", "--no-trunc", "-a").stdout.split())


def wipe(*hosts: Host) -> None:
    """Every image on these hosts' engines removed."""
    for h in hosts:
        for image_id in ids(h):
            h.docker("rmi", "-f", image_id, check=False)


def same_as_source(data: Path, paths: list[Path]) -> None:
    """Each of ``paths`` holds exactly ``data``'s files (names, sizes, modes and contents: the same-data check's
    manifest, hashes included)."""
    from nodekit.launcher.datacheck.manifest import digest, first_differences, manifest

    want = manifest(str(data), hashes=True)
    for p in paths:
        have = manifest(str(p), hashes=True)
        assert digest(have) == digest(want), f"{p}: {first_differences(want, have)}"


MIB = 24  # random bytes: gzip cannot shrink them, so the stream is about this size


def head_tx(h0: Host) -> int:
    return tx_bytes(sh("ip", "-n", h0.netns, "-s", "-j", "link").stdout, h0.iface)


def push_env(fleet: Fleet) -> dict[str, str]:
    return {**fleet.env, "DOCKER_HOST": fleet.cluster.main.docker_host}  # no user agent, as in CI


def push_argv(fleet: Fleet, *targets: Host, relay: str = "always") -> list[str]:
    to = [arg for h in targets for arg in ("--to", f"{h.name}={fleet.url(h)}")]
    return nodekit_argv("push", REF, *to, "--relay", relay)


def relay_dirs(cluster: Cluster) -> set[Path]:
    """The relay's temporary directories on ``cluster``'s hosts: in its sessions' TMPDIR (``Host.tmp``), which
    its hosts share, and no other cluster's tests write to."""
    return set(cluster.main.tmp.glob("nodekit-relay.*"))


def loading(host: Host) -> bool:
    """Whether a ``docker load`` runs in ``host`` (the relay's stream has reached it)."""
    for pid in pids_in_netns(os.stat(host.netns_path).st_ino):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"load" in argv and any(a.endswith(b"docker") for a in argv):
            return True
    return False


# --- a `nodekit run` on the head: its end, a line in its log, what it left -----------------------------------------


def nothing_left(cluster: Cluster) -> None:
    for h in cluster.hosts:
        left = h.docker("ps", "-aq").stdout.split()
        assert left == [], f"{h.name} still has containers {left}"


def finish(proc: subprocess.Popen[str], log: Path, timeout: float, what: str = "nodekit run") -> tuple[int, str]:
    """``proc``'s exit code and its log, once it ends; killed, and the test failed, after ``timeout`` seconds."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what} did not end within {timeout:.0f} s:\n{log.read_text()[-4000:]}") from None
    return code, log.read_text(errors="replace")


def wait_for(log: Path, text: str, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
        time.sleep(0.3)


# --- images built from other inputs ---------------------------------------------------------------------------


def tampered_image(host: Host, ref: str) -> str:
    """On ``host``, an image like ``ref`` but built from other inputs: another fingerprint and one more file."""
    other = "f" * 64
    name = f"{ref.rsplit(':', 1)[0]}:tampered"
    cid = host.docker("create", ref).stdout.strip()
    try:
        extra = Path(host.run_dir) / "extra.txt"
        extra.write_text("an extra package\n")
        host.docker("cp", str(extra), f"{cid}:/extra.txt")
        host.docker("commit", "--change", f"ENV NODEKIT_FINGERPRINT={other}", "--change",
                    f"LABEL org.nodekit.fingerprint={other}", cid, name)  # fmt: skip
    finally:
        host.docker("rm", "-f", cid, check=False)
    return name


def fleet_on(cluster: Cluster, ssh_keys: SshKeys, tmp_path: Path) -> Iterator[Fleet]:
    """A :class:`Fleet` of any cluster (the ``fleet`` fixture of conftest.py is this on ``cluster``)."""
    d = tmp_path / "ssh"
    authorized = ssh_keys.public(ssh_keys.client_key)
    bin_dir = ssh_client(d, cluster.hosts, ssh_keys.client_key, ssh_keys.public(ssh_keys.host_key))
    config = d / "ssh_config"
    try:
        for h in cluster.hosts:
            h.start_sshd(authorized, ssh_keys.host_key)
        yield Fleet(cluster=cluster, keys=ssh_keys, config=config, bin=bin_dir)
    finally:
        for h in cluster.hosts:
            h.stop_sshd()
