"""The virtual cluster as the shipping benchmarks use it (benchmarks/ship_bench.py, benchmarks/cuda_bench.py): a head
(h0) and N targets, each a network namespace with its own dockerd on one image store and Debian's sshd; nodekit's
push from the head over real SSH, the registry anchor, and the raw copy of the same bytes over the same SSH.

The head sends from this machine's engine of that store (the classic one at /var/run/docker.sock, the containerd-
store one that `make engine-containerd` starts): its unix socket is reachable from h0's namespace, so the image
never has to be copied into h0's own engine first, and the project's blob store is the one `nodekit build` wrote,
as for `nodekit push` run in the project. The registry anchor is Debian's `docker-registry` (the CNCF distribution
registry), one storage directory per store: a process in this machine's namespace takes the source engine's
`docker push`, a second one in h0's namespace serves the same directory to the targets, each through an `ssh -R`
tunnel from the head (Docker accepts plain HTTP for a localhost registry), so its bytes cross the head's link inside
SSH like nodekit's. Everything started here is stopped by PID in :meth:`ShipCluster.down`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cluster.harness import Host

ROOT = Path(__file__).resolve().parents[1]
CLASSIC_ENGINE = "unix:///var/run/docker.sock"
CONTAINERD_ENGINE = os.environ.get("NODEKIT_CONTAINERD_HOST", "unix:///run/nodekit-engine-sid/containerd/docker.sock")
REGISTRY = Path("/usr/bin/docker-registry")
REG_PORT = 5000
PROBE = f"import socket; socket.create_connection(('127.0.0.1', {REG_PORT}), timeout=1).close()"


def engine_of(store: str) -> str:
    """The endpoint of this machine's engine with ``store``; SystemExit naming the fix when it is not there or keeps
    images in the other store."""
    from nodekit.errors import NodekitError
    from nodekit.system import docker

    endpoint = CONTAINERD_ENGINE if store == "containerd" else CLASSIC_ENGINE
    fix = "make engine-containerd" if store == "containerd" else "make engine"
    try:
        facts = docker.engine_facts(endpoint)
    except NodekitError as e:
        raise SystemExit(f"no {store}-store engine at {endpoint}: {e.message} (run {fix})") from None
    if facts.containerd_store != (store == "containerd"):
        raise SystemExit(f"the engine at {endpoint} does not keep images in the {store} store (run {fix})")
    return endpoint


def stage(refs: Sequence[str], engine: str, blobs: Path | None, base: str | None) -> list[str]:
    """Put ``refs`` (built on the classic engine) and their ``base`` on ``engine`` with nodekit's own push (the
    archive both stores read, from the project's blob store): the head of a containerd-store run holds the same
    images, with the ids that store gives them. Returns the refs that were not there before: the bench's, to remove."""
    from nodekit import ship
    from nodekit.system import docker
    from nodekit.system.progress import NullReporter

    added = []
    for ref in [*([base] if base else []), *refs]:
        if docker.image_info(ref, engine) is None:
            added.append(ref)
        src = ship.source_of(ref, CLASSIC_ENGINE, store=blobs if ref != base else None)
        plan = ship.plan_push(src, ship.survey(src, [ship.Target("head", engine)]), here_zstd=ship.zstd_here())
        ship.push(plan, NullReporter())
    return added


def remove_refs(refs: Sequence[str], engine: str) -> None:
    """Untag what this bench added (the image goes with its last tag; what others hold of it stays)."""
    for ref in refs:
        subprocess.run(["docker", "-H", engine, "rmi", ref], capture_output=True, timeout=600)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process this bench started, SIGKILL if it is still there 10 s later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(host: Host) -> bool:
    """Whether localhost:5000 answers in ``host``'s namespace."""
    return host.run("python3", "-c", PROBE).returncode == 0


def _wait(check: Callable[[], bool], proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.2)


@dataclass(frozen=True)
class Pushed:
    """One timed `nodekit push` (benchmarks/_ship_push.py's answer) and the head's link bytes around it."""

    seconds: float
    link_bytes: int
    sent: int
    skipped: int
    relayed: int
    codecs: tuple[str, ...]

    def note(self, targets: int) -> str:
        parts = [f"{'/'.join(self.codecs)} stream" if self.codecs else ""]
        parts.append(f"layer files skipped: {self.skipped}" if self.skipped else "")
        parts.append(f"relayed to {self.relayed} of {targets}" if self.relayed else "")
        return ", ".join(p for p in parts if p)


class ShipCluster:
    """1 + ``targets`` hosts on ``store``, sshd on each, our ssh client first on the head's PATH; links unshaped until
    :meth:`shape`. Use as a context manager: :meth:`down` purges the hosts' data roots, also on failure."""

    def __init__(self, name: str, targets: int, store: str, work: Path) -> None:
        from tests.cluster.harness import Cluster

        self.store, self.work = store, work
        self.cluster = Cluster(1 + targets, name=name, owner=os.getpid(), decoy=False)
        for h in self.cluster.hosts:
            h.containerd_store = store == "containerd"
        self.started: list[subprocess.Popen[bytes]] = []
        self.shaped: list[tuple[str, str]] = []
        self.bin_dir = Path()
        self.head_env: dict[str, str] = {}

    def __enter__(self) -> ShipCluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def head(self) -> Host:
        return self.cluster.main

    @property
    def targets(self) -> list[Host]:
        return list(self.cluster.hosts[1:])

    def up(self) -> None:
        from tests.cluster.harness import ssh_client

        c = self.cluster
        c.up()
        keys = self.work / "ssh"
        keys.mkdir(parents=True, exist_ok=True)
        for key in ("host", "client"):
            if not (keys / key).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key)], check=True)
        self.bin_dir = ssh_client(keys / "config", c.hosts, keys / "client", (keys / "host.pub").read_text())
        for h in c.hosts:
            h.start_sshd((keys / "client.pub").read_text(), keys / "host")
        self.head_env = {"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}

    def shape(self, mbit: int) -> None:
        """Every host's veth limited to ``mbit`` Mbit/s, both directions (tc tbf)."""
        from benchmarks._shipnet import tbf_argv
        from tests.cluster.harness import sh

        for h in self.cluster.hosts:
            for ns, dev in ((h.netns, h.iface), (self.cluster.switch, h.name)):
                sh("tc", "-n", ns, *tbf_argv(dev, mbit))
                if (ns, dev) not in self.shaped:
                    self.shaped.append((ns, dev))

    def down(self) -> None:
        from tests.cluster.harness import sh

        for proc in reversed(self.started):  # tunnels, then the registries: only what this run started, by PID
            _stop(proc)
        self.started.clear()
        for ns, dev in self.shaped:
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        self.shaped.clear()
        for h in self.cluster.hosts:
            h.stop_sshd()
        self.cluster.down(purge=True)  # never leave image copies in the virtual hosts' engines

    def head_tx(self) -> int:
        from benchmarks._shipnet import tx_bytes
        from tests.cluster.harness import sh

        h0 = self.head
        return tx_bytes(sh("ip", "-n", h0.netns, "-s", "-j", "link").stdout, h0.iface)

    # -- nodekit --

    def push(self, ref: str, targets: Sequence[Host], *, source: str, blobs: Path | None, relay: str = "auto",
             compress: str = "auto", whole: bool = False, timeout: float = 3600) -> Pushed:  # fmt: skip
        """`nodekit push` of ``ref`` from ``source`` to ``targets`` over ssh://, run on the head as a user runs it in
        the project (``blobs``: its blob store). SystemExit with its output when it fails."""
        argv = [sys.executable, str(ROOT / "benchmarks" / "_ship_push.py"), "--source", source, "--relay", relay,
                "--compress", compress]  # fmt: skip
        argv += ["--whole"] if whole else ["--store", str(blobs)] if blobs is not None else []
        argv += [ref, *(f"ssh://root@{t.addr}" for t in targets)]
        before = self.head_tx()
        proc = self.head.run(*argv, env=self.head_env, timeout=timeout)
        after = self.head_tx()
        if proc.returncode != 0:
            raise SystemExit(f"push failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        return Pushed(seconds=round(got["seconds"], 2), link_bytes=after - before, sent=sum(got["sent"].values()),
                      skipped=sum(got["skipped"].values()), relayed=len(got.get("relayed") or {}),
                      codecs=tuple(got.get("codecs") or ()))  # fmt: skip

    def wipe(self, targets: Sequence[Host]) -> None:
        """Every image off ``targets``: they start empty, as nodes that never had the image."""
        for t in targets:
            for image_id in sorted(set(t.docker("images", "-q", "--no-trunc", "-a").stdout.split())):
                t.docker("rmi", "-f", image_id, check=False, timeout=600)

    def remove(self, targets: Sequence[Host], refs: Sequence[str]) -> None:
        for t in targets:
            for ref in refs:
                t.docker("rmi", "-f", ref, check=False, timeout=600)

    # -- the raw copy --

    def raw_copy(self, files: Sequence[Path], target: Host) -> tuple[float, int]:
        """``cat files | ssh target 'cat > /dev/null'`` from the head, with the ssh nodekit's pushes use: seconds and
        the head's link bytes."""
        ssh = self.bin_dir / "ssh"
        script = 'f="$1"; shift; cat "$@" | "$f" "root@$ADDR" "cat > /dev/null"'
        before = self.head_tx()
        t0 = time.monotonic()
        proc = self.head.run("sh", "-c", script, "raw", str(ssh), *map(str, files), env={"ADDR": target.addr},
                             timeout=3600)  # fmt: skip
        seconds = time.monotonic() - t0
        after = self.head_tx()
        if proc.returncode != 0:
            raise SystemExit(f"the raw copy to {target.name} failed: {proc.stderr[-2000:]}")
        return round(seconds, 2), after - before

    def ssh_debug(self, target: Host) -> str:
        """What ``ssh -v target true`` says (the negotiated cipher is in it)."""
        proc = self.head.run(str(self.bin_dir / "ssh"), "-v", "-o", "LogLevel=DEBUG1", f"root@{target.addr}", "true")
        return str(proc.stderr)

    # -- the registry anchor --

    def registry_for_targets(self, regdir: Path) -> None:
        """Serve ``regdir``'s registry in the head's namespace and open an ``ssh -R`` tunnel to it from every target's
        localhost:5000."""
        h0 = self.head
        config = registry_config(regdir)
        with open(regdir / "log-h0", "a") as log:
            self.started.append(subprocess.Popen(h0.argv(str(REGISTRY), "serve", str(config)), stdout=log, stderr=log))
        _wait(partial(_answers, h0), self.started[-1], "the head's registry")
        for t in self.targets:
            fwd = f"127.0.0.1:{REG_PORT}:127.0.0.1:{REG_PORT}"
            ssh = [str(self.bin_dir / "ssh"), "-N", "-o", "ExitOnForwardFailure=yes", "-R", fwd, f"root@{t.addr}"]
            with open(self.work / f"tunnel-{t.name}.log", "a") as log:
                self.started.append(subprocess.Popen(h0.argv(*ssh), stdout=log, stderr=log, env=h0.env(self.head_env)))
            _wait(partial(_answers, t), None, f"the tunnel to {t.name}")

    def pull(self, ref: str, targets: Sequence[Host], identity: str) -> tuple[float, int]:
        """Every target pulls ``ref`` from the registry at once: seconds and the head's link bytes. SystemExit when a
        pull fails or gives another image than ``identity`` (compared by identity: a pull on the containerd store
        gives the image another id than nodekit's load)."""
        from nodekit.system import docker

        before = self.head_tx()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            done = list(pool.map(lambda t: t.docker("pull", "-q", ref, timeout=3600, check=False), targets))
        seconds = time.monotonic() - t0
        after = self.head_tx()
        for t, p in zip(targets, done, strict=True):
            got = docker.image_info(ref, t.docker_host) if p.returncode == 0 else None
            if got is None or got.identity != identity:
                raise SystemExit(f"pull on {t.name} failed or gave another image: {p.stderr.strip()[-2000:]}")
        return round(seconds, 2), after - before


def registry_config(regdir: Path) -> Path:
    (regdir / "data").mkdir(parents=True, exist_ok=True)
    config = regdir / "config.yml"
    config.write_text("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {regdir / 'data'}\nhttp:\n  addr: 127.0.0.1:{REG_PORT}\n")  # fmt: skip
    return config


def registry_push(regdir: Path, source: str, tags: dict[str, str], repo: str) -> dict[str, float]:
    """The source engine pushes each version once to an empty registry over ``regdir`` (served here, in this
    machine's namespace, for the length of the pushes), as a registry user does after each build: seconds per
    version."""
    import shutil

    if not REGISTRY.is_file():
        raise SystemExit(f"{REGISTRY} is missing: apt-get install -y docker-registry")
    shutil.rmtree(regdir / "data", ignore_errors=True)  # an empty registry: a blob left from before would be skipped
    config = registry_config(regdir)
    here = [sys.executable, "-c", PROBE]
    if subprocess.run(here, capture_output=True).returncode == 0:
        raise SystemExit(f"127.0.0.1:{REG_PORT} is taken on this machine: the registry anchor needs it for its pushes")
    with open(regdir / "log", "a") as log:
        server = subprocess.Popen([str(REGISTRY), "serve", str(config)], stdout=log, stderr=log)
    try:
        _wait(lambda: subprocess.run(here, capture_output=True).returncode == 0, server, "the registry")
        pushes = {}
        for case, tag in tags.items():
            ref = f"localhost:{REG_PORT}/{repo}:{case}"
            subprocess.run(["docker", "-H", source, "tag", tag, ref], check=True)
            t0 = time.monotonic()
            subprocess.run(["docker", "-H", source, "push", "-q", ref], check=True, capture_output=True, timeout=3600)
            pushes[case] = round(time.monotonic() - t0, 2)
            subprocess.run(["docker", "-H", source, "rmi", ref], check=True, capture_output=True)
            print(f"registry push {case} ({source}): {pushes[case]:.1f} s", flush=True)
        return pushes
    finally:
        _stop(server)


def registry_bytes(regdir: Path) -> int:
    blobs = regdir / "data" / "docker" / "registry" / "v2" / "blobs"
    return sum(p.stat().st_size for p in blobs.rglob("data"))


def layer_files(ref: str, source: str, blobs: Path, dest: Path) -> list[Path]:
    """The files of ``ref``'s layers, base first, as a whole-image push sends them uncompressed: the project's blob
    store holds every layer above the base; the base's are read once out of ``docker save`` of the base on
    ``source`` into ``dest`` (kept there for the next run)."""
    import tarfile

    from nodekit.image.blobs import BlobStore
    from nodekit.image.plan import LABEL_BASE
    from nodekit.system import docker

    info = docker.require_image(ref, source)
    image = BlobStore(blobs).image(info.id)
    if image is None:
        raise SystemExit(f"{ref} is not in the blob store {blobs}: build it in that project")
    files, wanted = [], {}
    for desc in image.layers:
        path = BlobStore(blobs).verified_path(desc.digest) or dest / desc.digest.removeprefix("sha256:")
        files.append(path)
        if not path.is_file():
            wanted[f"blobs/sha256/{desc.digest.removeprefix('sha256:')}"] = path
    if wanted:
        base = info.labels.get(LABEL_BASE)
        if not base:
            raise SystemExit(f"{ref} names no base image ({LABEL_BASE}), whose layers the blob store lacks")
        dest.mkdir(parents=True, exist_ok=True)
        save = subprocess.Popen(["docker", "-H", source, "save", base], stdout=subprocess.PIPE)
        assert save.stdout is not None
        with tarfile.open(fileobj=save.stdout, mode="r|") as tar:
            for member in tar:
                if member.name in wanted and (f := tar.extractfile(member)) is not None:
                    with open(wanted.pop(member.name), "wb") as out:
                        while piece := f.read(1 << 20):
                            out.write(piece)
        save.stdout.close()
        save.wait()
        if wanted:
            raise SystemExit(f"docker save {base} lacks the layers {', '.join(sorted(wanted))}")
    return files
