"""Shared builders of the test tiers: plain constants and functions, no fixtures and no test.

A value or builder used by more than one test module lives here, so that no test module imports another (the rule
tests/unit/meta/test_test_imports.py holds). A builder used by one module stays in it; shared pytest fixtures live in
the conftest.py of the folder whose tests use them. Grouped by the part of nodekit the values describe.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import shutil
import socket
import struct
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nodekit import ship
from nodekit.backends.compose.node import NodePlan, plan
from nodekit.backends.compose.render import render_compose, to_yaml
from nodekit.config.settings import Settings, load
from nodekit.image.plan import LABEL_FINGERPRINT, LABEL_LOCK
from nodekit.job.container import MAIN_ADDR, RANK
from nodekit.job.env import node_env as rendered_env
from nodekit.job.gather import gather_node
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.launcher.config import LaunchConfig, parse_env
from nodekit.launcher.contract import PREFLIGHT_OK, RENDEZVOUS_DONE
from nodekit.launcher.preflight.exchange import Clock, Outcome, run_main, run_worker
from nodekit.launcher.preflight.stack import StackReport
from nodekit.launcher.stacks import collect
from nodekit.launcher.stacks.places import RankStack
from nodekit.launcher.store import auth
from nodekit.launcher.store.client import Client, recv_exact
from nodekit.launcher.store.kv import Hosted, Limits
from nodekit.launcher.watchdog.run import Reading, Watch, Watchdog
from nodekit.runs.recorder import Recorder
from nodekit.system.host.facts import HostFacts

# --- the compose backend: settings, host facts, a rendered node ------------------------------------------------

PROJECT = Path("/srv/project")

CPU_NODE = HostFacts(gpu_count=0, memlock_hard=8 * 1024 * 1024, stack_hard=None, iface="eth0", local_addr="10.0.0.5")
GPU_NODE = HostFacts(
    gpu_count=8,
    gpu_models=("NVIDIA H100 80GB HBM3",) * 8,
    memlock_hard=None,
    stack_hard=None,
    infiniband=("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"),
    iface="ens5",
    local_addr="10.0.0.6",
)


def settings(**kw: object) -> Settings:
    """The demo project's settings at PROJECT (2 nodes, train.py --epochs 3), with ``kw`` on top."""
    base: dict[str, object] = {"name": "demo", "script": "train.py", "args": ("--epochs", "3"), "nnodes": 2}
    return Settings(project_dir=PROJECT, **(base | kw))  # type: ignore[arg-type]


def rendered(s: Settings, rank: int, facts: HostFacts, *, debug: bool = False) -> str:
    """Node ``rank``'s compose file as text, main at 10.0.0.5, with ``facts`` for its host."""
    launch = launch_spec(s)
    node = node_spec(s, launch, rank, "10.0.0.5", facts)
    doc = render_compose(
        plan_container(node, facts, image="nodekit/demo:0123456789ab", output_dir=PROJECT / "outputs", debug=debug)
    )
    return to_yaml(doc, rank=rank, nnodes=launch.nnodes, path_hint=f"compose/node-{rank}.yaml")


def plan_here(
    settings: Settings, rank: int, main: str, *, debug: bool = False, out_dir: Path | None = None, **gather: Any
) -> NodePlan:
    """The one-call form of planning a node: :func:`nodekit.job.gather.gather_node` on this machine (``gather``:
    its keyword arguments), then :func:`nodekit.backends.compose.node.plan`'s node plan."""
    return plan(settings, gather_node(settings, rank, main, **gather), debug=debug, out_dir=out_dir).detail


# --- the launcher: its environment, node facts, an in-memory store ---------------------------------------------

# What nodekit/job/env.py renders for node 1 of a 2-node job (the launcher's environment contract).
LAUNCH_ENV = {
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29500",
    "NODE_RANK": "1",
    "NNODES": "2",
    "NPROC_PER_NODE": "4",
    "WORLD_SIZE": "8",
    "NODEKIT_NAME": "ddp-demo",
    "NODEKIT_LAUNCHER": "torchrun",
    "NODEKIT_MAX_RESTARTS": "0",
    "NODEKIT_RDZV_TIMEOUT": "180",
    "NODEKIT_PREFLIGHT_PORT": "29501",
    "NODEKIT_OUTPUT_DIR": "/outputs",
    "GLOO_SOCKET_IFNAME": "eth0",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_IB_DISABLE": "1",
    "NODEKIT_FINGERPRINT": "3f2a9c1b0d4e5566",
}

NODE0 = StackReport(
    rank=0,
    hostname="gpu-a",
    address="10.0.0.5",
    fingerprint="3f2a9c1b0d4e55667788",
    image_id="sha256:aaaabbbbccccddddeeee",
    python="3.11.2",
    torch="2.13.0+cu128",
    cuda="12.8",
    cudnn="91002",
    nccl="2.27.3",
    driver="570.133.20",
    gpu_model="NVIDIA H100 80GB HBM3",
    gpu_count=8,
    nodekit="0.1.0",
    nnodes=2,
    nproc_per_node=8,
    world_size="16",
    master_port=29500,
    mode="torchrun",
    name="ddp-demo",
)
NODE1 = replace(NODE0, rank=1, hostname="gpu-b", address="10.0.0.6")
# The verdict's other arguments for NODE0 and NODE1.
VERDICT_KW: dict[str, Any] = {"nnodes": 2, "timeout_s": 180.0, "main": "10.0.0.5:29501"}


class MemStore:
    """A thread-safe stand-in for the preflight store (set/get/add/check)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.broken = False

    def _alive(self) -> None:
        if self.broken:
            raise RuntimeError("Connection reset by peer\nmore detail")

    def set(self, key: str, value: str) -> None:
        self._alive()
        with self.lock:
            self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        self._alive()
        with self.lock:
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        self._alive()
        with self.lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def check(self, keys: list[str]) -> bool:
        self._alive()
        with self.lock:
            return all(k in self.data for k in keys)


LAUNCHER_CPU = HostFacts(gpu_count=0, memlock_hard=None, stack_hard=None, iface="eth0", local_addr="10.0.0.6")


def node_env(rank: int = 1, **kw: object) -> dict[str, str]:
    """Node ``rank``'s environment for a 2-node job (main 10.0.0.5) with settings ``kw``, as the compose file has it."""
    base: dict[str, object] = {"name": "demo", "script": "train.py", "nnodes": 2}
    s = Settings(project_dir=Path("/srv/demo"), **(base | kw))  # type: ignore[arg-type]
    launch = launch_spec(s)
    node = node_spec(s, launch, rank, "10.0.0.5", LAUNCHER_CPU)
    holes = {RANK: str(rank), MAIN_ADDR: "10.0.0.5"}
    return {v.name: holes.get(v.value, v.value) if not isinstance(v.value, str) else v.value
            for v in rendered_env(node, LAUNCHER_CPU) if isinstance(v.value, str) or v.value in holes}  # fmt: skip


# fixtures/*-node<R>.json are what ``python -m nodekit.launcher.stacks`` printed on node R of real runs:
# ``training`` and ``mismatch`` from tests/integration/test_stall.py (``NODEKIT_STACKS_CAPTURE=<dir>``: two nodes of
# examples/ddp/stall.py in the image, Python 3.11, gloo) while the job trained and once its ranks had issued
# different collectives; ``py313-threads`` from a process with a second thread under Debian trixie's Python 3.13
# (the hook armed by hand, see the test that uses it).
STACK_FIXTURES = Path(__file__).parent / "unit" / "launcher" / "fixtures"


def captured(name: str) -> list[RankStack]:
    """Every node's processes of one capture, as the host reads them."""
    stacks = []
    for path in sorted(STACK_FIXTURES.glob(f"{name}-node*.json")):
        node = int(path.stem.rsplit("-node", 1)[1])
        stacks += [RankStack.of(p, node) for p in collect.from_json(path.read_text())]
    assert stacks, f"no fixture {name}"
    return stacks


def cfg(rank: int, nnodes: int = 2, timeout: float = 5.0, **env: str) -> LaunchConfig:
    """LAUNCH_ENV parsed for node ``rank`` of ``nnodes``, with ``timeout`` as the rendezvous timeout."""
    return parse_env({**LAUNCH_ENV, "NODE_RANK": str(rank), "NNODES": str(nnodes),
                      "NODEKIT_RDZV_TIMEOUT": str(timeout), **env})  # fmt: skip


def quiet() -> Clock:
    lines: list[str] = []
    return Clock(log=lines.append)


def facts(rank: int, **changes: Any) -> StackReport:
    """NODE0's stack as node ``rank`` (its own host name and address), with ``changes``."""
    identity: dict[str, Any] = {"rank": rank, "hostname": f"host-{rank}", "address": f"10.0.0.{5 + rank}"}
    return replace(NODE0, **(identity | changes))


def run_nodes(store: MemStore, nodes: list[tuple[LaunchConfig, StackReport]]) -> list[Outcome]:
    """Run node 0 (first in ``nodes``) and the workers concurrently; return their outcomes in order."""
    results: list[Any] = [None] * len(nodes)

    def go(i: int, c: LaunchConfig, f: StackReport) -> None:
        results[i] = (run_main if c.is_main else run_worker)(store, c, f, quiet())

    threads = [threading.Thread(target=go, args=(i, c, f)) for i, (c, f) in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return results


# --- the launcher's preflight store on loopback -----------------------------------------------------------------

S1, S2 = "a" * 32, "b" * 32  # two job secrets
STORE_LIMITS = Limits(handshake_s=0.5, max_pending=16)


def join(hosted: Hosted, secret: str = S1, connect_s: float = 5.0) -> Client:
    return Client.connect("127.0.0.1", hosted.port, secret, timeout_s=5, connect_s=connect_s, limits=STORE_LIMITS)


def wait_for(condition: Callable[[], bool], within: float = 5.0) -> bool:
    """Whether ``condition`` holds within ``within`` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


BEHAVIOURS = ("close", "garbage", "length", "partial", "guess", "silent")


def hostile(port: int, behaviour: str, held: list[socket.socket]) -> None:
    """One connection of a client without the secret; the ones meant to linger are kept open in ``held``."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    try:
        if behaviour == "garbage":
            sock.sendall(os.urandom(64 << 10))
        elif behaviour == "length":  # what a length-prefixed protocol would read as a 4 GiB frame, and then some
            sock.sendall(b"\xff\xff\xff\xff" * 16)
        elif behaviour == "partial":  # slowloris: a hello that never finishes
            sock.sendall(auth.MAGIC + b"\x00" * 10)
        elif behaviour == "guess":  # a well-formed hello, then a proof made up without the secret
            sock.sendall(auth.client_hello(os.urandom(auth.NONCE_LEN)))
            recv_exact(sock, auth.SERVER_HELLO_LEN)
            sock.sendall(os.urandom(auth.PROOF_LEN) + b"\x00\x00\x00\x10" + os.urandom(48))
    except (OSError, EOFError):  # EOFError: recv_exact's word for a connection closed mid-read
        pass  # main cut it off: what it should do (the attacker goes on with its next connection)
    if behaviour in ("partial", "silent", "length"):
        held.append(sock)
        if len(held) > 200:  # the client's own descriptors: keep its latest 200 open
            held.pop(0).close()
    else:
        sock.close()


# --- the launcher's peer watchdog -------------------------------------------------------------------------------

NAMES = {0: "10.0.0.5, host gpu-a", 1: "10.0.0.6, host gpu-b", 2: "172.31.250.12, host h2"}
WATCHDOG_FAST = {"beat_s": 0.02, "judge_s": 0.01}  # real time scaled down: a beat of 20 ms


def beat(watch: Watch, at: float, counts: dict[int, int], **kw: object) -> None:
    watch.see(Reading(at=at, counts=counts, **kw))  # type: ignore[arg-type]


class Node:
    """One node's watchdog, with what it printed and whether it was told to stop."""

    def __init__(self, store: MemStore, rank: int, nnodes: int, timeout: float, **kw: object) -> None:
        self.lines: list[str] = []
        self.stopped = threading.Event()
        self.exits: list[int] = []
        self.dog = Watchdog(
            store,
            rank,
            nnodes,
            timeout,
            NAMES,
            stop=self.stopped.set,
            clock=Clock(log=self.lines.append),
            err=self.lines.append,
            hard_exit=self.exits.append,
            **{**WATCHDOG_FAST, **kw},  # type: ignore[arg-type]
        )


# --- processes ----------------------------------------------------------------------------------------------------


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` has ended (no such process, or a zombie nobody reaped yet) within ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


# --- shipping images --------------------------------------------------------------------------------------------

SRC = ship.Source(ref="nodekit/demo:abc123", image_id="sha256:" + "a" * 64, size=2 << 30, engine_id="engine-src")


def state(name: str, endpoint: str | None = None, **kw: object) -> ship.TargetState:
    """What the survey found on target ``name`` (reached over ssh:// unless ``endpoint``), with ``kw``."""
    t = ship.Target(name=name, endpoint=endpoint or f"ssh://root@{name}")
    kw.setdefault("engine_id", f"engine-{name}")
    kw.setdefault("server_version", "26.1.5")
    return ship.TargetState(target=t, **kw)  # type: ignore[arg-type]


# --- the lock: projects, wheels and source distributions for an offline pip ---------------------------------------


def project(tmp_path: Path, packages: list[str], lock_text: str | None = None) -> Settings:
    """A project in ``tmp_path`` asking for ``packages`` (and holding ``lock_text`` as its lock), loaded."""
    quoted = ", ".join(f'"{p}"' for p in packages)
    (tmp_path / "nodekit.toml").write_text(f'name = "t"\nscript = "train.py"\npackages = [{quoted}]\n')
    if lock_text is not None:
        (tmp_path / "nodekit.lock").write_text(lock_text)
    return load(tmp_path / "nodekit.toml")


def fake_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid pure-Python wheel (metadata only), enough for pip to resolve and download it."""
    dist = f"{name}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    files = {
        f"{name}/__init__.py": "",
        f"{dist}.dist-info/METADATA": "\n".join(
            [
                "Metadata-Version: 2.1",
                f"Name: {name}",
                f"Version: {version}",
                *(f"Requires-Dist: {r}" for r in requires),
            ]
        )
        + "\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for arc, content in files.items():
            z.writestr(arc, content)
            digest = base64.urlsafe_b64encode(hashlib.sha256(content.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(content)}")
        record.append(f"{dist}.dist-info/RECORD,,")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


C_MODULE = (
    "#include <Python.h>\n"
    'static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "cext", NULL, -1, NULL};\n'
    "PyMODINIT_FUNC PyInit_cext(void) { return PyModule_Create(&def); }\n"
)


def make_sdist(
    directory: Path, name: str, version: str, requires: tuple[str, ...] = (), *, c_ext: bool = False
) -> Path:
    """A real source distribution built by setuptools: a pure module, or a C extension (``c_ext``)."""
    deps = ", ".join(f'"{r}"' for r in requires)
    pyproject = (
        '[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{deps}]\n'
    )
    files = {"PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}
    if c_ext:
        files["setup.py"] = (
            f'from setuptools import Extension, setup\nsetup(ext_modules=[Extension("{name}", ["{name}.c"])])\n'
        )
        files[f"{name}.c"] = C_MODULE.replace("cext", name)
        files["pyproject.toml"] = pyproject + "\n[tool.setuptools]\npy-modules = []\n"
    else:
        files["pyproject.toml"] = pyproject + f'\n[tool.setuptools]\npy-modules = ["{name}"]\n'
        files[f"{name}.py"] = f'VERSION = "{version}"\n'
    path = directory / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        for rel, content in sorted(files.items()):
            data = content.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1700000000
            t.addfile(info, io.BytesIO(data))
    return path


# --- run records (nodekit/runs/): a project, a clock a test moves, a 3-node run as the backends tell it -------------


def project_settings(path: Path, extra: str = "") -> Settings:
    (path / "nodekit.toml").write_text(f'name = "recdemo"\nscript = "train.py"\nnnodes = 3\n{extra}')
    (path / "train.py").write_text("print(1)\n")
    return load(path / "nodekit.toml")


@dataclass
class RunClock:
    """Wall-clock time a test moves (a run record's timestamps)."""

    now: float = 1_795_000_000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, s: float) -> float:
        self.now += s
        return self.now


HOSTS = [(0, "root@10.0.0.1"), (1, "root@10.0.0.2"), (2, "root@10.0.0.3")]


C10D = "[W1126 02:27:34.056443259 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3"


def play_three_nodes(rec: Recorder, clock: RunClock, *, kill: int | None = None) -> None:
    """What the fleet backend and the log follower tell a recorder during a 3-node run."""
    rec.image("nodekit/recdemo:0123456789ab", "sha256:" + "a" * 64, {LABEL_FINGERPRINT: "f" * 64, LABEL_LOCK: "1" * 64})
    for rank in range(3):
        clock.tick(0.5)
        rec.phase(rank, "image")
    for rank in range(3):
        clock.tick(1.0)
        rec.phase(rank, "started")
    for rank in range(3):
        clock.tick(0.2)
        rec.line(rank, f"nodekit recdemo: node {rank}/3 | 1 proc/node")
        rec.line(rank, f"{PREFLIGHT_OK}, 3/3 nodes, identical stacks")
        rec.line(rank, C10D)  # torch's own, in the launcher's process before the workers start: not the job's
        rec.line(rank, RENDEZVOUS_DONE)
    for step in range(30):
        for rank in range(3):
            clock.tick(0.1)
            rec.line(rank, f"step {step} on rank {rank}")
    for rank in range(3):
        clock.tick(0.3)
        rec.exited(rank, 137 if rank == kill else (143 if kill is not None else 0))


def copy_checkout(src: Path, dest: Path, *, builds: bool = False) -> Path:
    """A copy of the project ``src`` as another checkout of it (another machine's, or a changed one): no outputs, no
    compose files, no build contexts; the blob store (content-addressed, never written in place) hard-linked, not
    copied; the wheelhouse linked too when the copy ``builds``, left out otherwise. A plain copy is gigabytes for
    the demo and every test keeps its tmp until the session ends."""
    linked = ("blobs", "wheelhouse") if builds else ("blobs",)

    def leave_out(folder: str, names: list[str]) -> set[str]:
        skip = {"outputs", "compose", "__pycache__"}
        if Path(folder).name == ".nodekit":
            skip |= {"build"} if builds else {"build", "wheelhouse"}
        return skip & set(names)

    def copy(a: str, b: str) -> str:
        if any(f"{os.sep}.nodekit{os.sep}{name}{os.sep}" in a for name in linked):
            os.link(a, b)
            return b
        return str(shutil.copy2(a, b))

    shutil.copytree(src, dest, ignore=leave_out, copy_function=copy)
    return dest


def tar_of(files: dict[str, bytes], *, link: str | None = None) -> bytes:
    """A tar archive of ``files`` (name -> bytes), with a symbolic link named ``link`` to manifest.json when given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = "manifest.json"
            tar.addfile(info)
    return buf.getvalue()


class Front:
    """A port in front of a link check listener on loopback: the first ``resets`` connections it accepts are reset at
    once (as by a listener that pushed them out, or a passing fault), the others are forwarded to the listener byte
    for byte, half-closes included, each chunk held ``delay_s`` each way (a slower path: a longer route, a full
    queue; both ends' kernels receive every frame that much later)."""

    def __init__(self, target: int, resets: int = 0, delay_s: float = 0.0) -> None:
        self.target, self.resets, self.accepted, self.delay_s = target, resets, 0, delay_s
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            if self.accepted <= self.resets:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # a reset, not an orderly close
                continue
            up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            self._socks += [conn, up]
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(10)
        try:
            while data := src.recv(1 << 16):
                time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in [self._sock, *self._socks]:
            s.close()


def shaper(slow: str, rate: float, pace: int = 16 << 10) -> type[socket.socket]:
    """A ``socket.socket`` whose sends are paced to ``rate`` bytes a second when either end is the address ``slow``:
    a shaper on one node's link (its own egress and the traffic toward it), for loopback where ``tc`` would slow
    every test's traffic. Patched over ``socket.socket``, it covers listeners' accepted connections and
    ``create_connection`` too (both build their sockets through that name)."""

    class Shaped(socket.socket):
        def _slow(self) -> bool:
            if self.family != socket.AF_INET:  # a socketpair's wake-up end
                return False
            try:
                return slow in (self.getsockname()[0], self.getpeername()[0])
            except OSError:
                return False

        def send(self, data: Any, flags: int = 0) -> int:
            if not self._slow():
                return super().send(data, flags)
            sent = super().send(memoryview(data)[:pace], flags)
            time.sleep(sent / rate)
            return sent

        def sendall(self, data: Any, flags: int = 0) -> None:
            if not self._slow():
                return super().sendall(data, flags)
            view = memoryview(data)
            while view:
                view = view[self.send(view, flags) :]
            return None

    return Shaped
