"""The virtual cluster itself: addresses and routes, separate engines, stop/cut/block, and cleanup of leftovers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.harness import NETNS_DIR, Cluster, leftovers, netns_inode, pids_in_netns

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

# Listens on a port inside a host, accepts one connection, prints "ok".
SERVER = (
    "import socket,sys; s=socket.create_server(('0.0.0.0', int(sys.argv[1]))); print('ready', flush=True); s.accept()"
)
CLIENT = (
    "import socket,sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close(); print('ok')\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)\n"
)


def connect(cluster: Cluster, src: int, dst: int, port: int, timeout: float = 2.0) -> str:
    """Try a TCP connection from host ``src`` to a listener on host ``dst``; 'ok' or the error's name."""
    server = cluster.hosts[dst].popen(sys.executable, "-c", SERVER, str(port))
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        out = cluster.hosts[src].run(
            sys.executable, "-c", CLIENT, cluster.hosts[dst].addr, str(port), str(timeout), timeout=30
        )
        return out.stdout.strip()
    finally:
        server.kill()
        server.wait()


def test_hosts_have_their_own_address_route_and_engine(cluster: Cluster) -> None:
    h0, h1, _ = cluster.hosts
    route = json.loads(h1.run("ip", "-j", "route", "get", h0.addr).stdout)[0]
    assert route["dev"] == h1.iface == "eth1" and route["prefsrc"] == h1.addr
    default = json.loads(h1.run("ip", "-j", "route", "show", "default").stdout)[0]
    assert default["dev"] == "decoy0", "the decoy must hold the default route"
    engines = {h.docker("info", "--format", "{{.ID}} {{.DockerRootDir}}").stdout.strip() for h in cluster.hosts}
    assert len(engines) == 3
    assert connect(cluster, 1, 0, 29400) == "ok"
    assert connect(cluster, 2, 1, 29401) == "ok"


def test_cut_makes_a_host_unreachable_and_reconnect_restores_it(cluster: Cluster) -> None:
    cluster.hosts[2].cut()
    assert connect(cluster, 2, 0, 29402, timeout=1.0) in ("TimeoutError", "OSError")
    cluster.hosts[2].reconnect()
    assert connect(cluster, 2, 0, 29403) == "ok"


def test_block_drops_one_port_only(cluster: Cluster) -> None:
    h0, h1, _ = cluster.hosts
    h1.block(h0.addr, [29404])
    route = json.loads(h1.run("ip", "-j", "route", "get", h0.addr).stdout)[0]
    assert route["dev"] == h1.iface, "blocking a port must not change the route to the host"
    assert connect(cluster, 1, 0, 29404, timeout=1.0) == "TimeoutError"
    assert connect(cluster, 1, 0, 29405) == "ok"
    assert connect(cluster, 2, 0, 29404) == "ok"
    h1.unblock()
    assert connect(cluster, 1, 0, 29404) == "ok"


def test_stop_kills_the_host_and_nothing_else(cluster: Cluster) -> None:
    h0, h1, _ = cluster.hosts
    stray = h1.popen("sleep", "600")
    ours = subprocess.Popen(["sleep", "600"])
    try:
        inode = netns_inode(h1.netns_path)
        assert inode is not None and h1.pid in pids_in_netns(inode)
        killed = h1.stop()
        assert killed >= 3  # dockerd, containerd, the sleep
        assert pids_in_netns(inode) == []
        assert stray.wait(timeout=5) == -signal.SIGKILL
        assert ours.poll() is None, "a process outside the host was killed"
        assert h0.docker("info", "--format", "{{.ID}}").returncode == 0
        assert h1.docker("info", check=False).returncode != 0
        cluster.restart(h1)
        assert h1.docker("info", "--format", "{{.ID}}").returncode == 0
    finally:
        ours.kill()
        ours.wait()


def test_a_leftover_of_a_killed_run_is_cleaned_at_start(cluster_ready: None) -> None:
    """A run killed hard leaves namespaces and daemons behind; the next cluster of that name removes them."""
    script = (
        "import os, time; from tests.cluster.harness import Cluster; "
        "Cluster(2, name='nkz', owner=os.getpid()).up(); print('up', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        stale = {ns: netns_inode(NETNS_DIR / ns) for ns in leftovers("nkz")}
        assert set(stale) == {"nkz-sw", "nkz-h0", "nkz-h1"}
        daemons = [p for ns, inode in stale.items() if inode for p in pids_in_netns(inode)]
        assert daemons
    finally:
        proc.kill()
        proc.wait()
    t0 = time.monotonic()
    c = Cluster(2, name="nkz", owner=os.getpid())
    c.up()
    try:
        assert all(not os.path.exists(f"/proc/{p}/ns") or _zombie(p) for p in daemons)
        assert c.hosts[1].docker("info", "--format", "{{.ID}}").returncode == 0
    finally:
        c.down()
    assert leftovers("nkz") == []
    assert time.monotonic() - t0 < 30


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
