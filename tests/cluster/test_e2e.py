"""Multi-host end to end: every node is its own host (namespace, address, dockerd, image store, checkout).

The job is examples/ddp on three hosts. Each node runs `nodekit up --node-rank R --main <host 0's address>` as a
user would on that machine: a subprocess inside the host's namespace with DOCKER_HOST at the host's engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cluster.harness import Cluster, Host, netns_inode, pids_in_netns
from tests.cluster.helpers import CLOSED_OR_CUT, Demo, host_project, nodekit_argv, tampered_image

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

MASTER_PORT = 29500
PREFLIGHT_PORT = MASTER_PORT + 1
EXIT_STACK_MISMATCH = 17  # nodekit/launcher/__init__.py
EXIT_RENDEZVOUS = 18
EXIT_PEER_LOST = 19
PEER_TIMEOUT = 15  # NODEKIT_PEER_TIMEOUT's default


@dataclass
class Node:
    rank: int
    host: Host
    project: Path
    proc: subprocess.Popen[str]
    log: Path
    code: int | None = None
    seconds: float = 0.0

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def compose(self) -> dict[str, object]:
        data = yaml.safe_load((self.project / "compose" / f"node-{self.rank}.yaml").read_text())
        assert isinstance(data, dict)
        return data


def start_job(
    cluster: Cluster,
    demo: Demo,
    base: Path,
    *,
    image: dict[int, str] | None = None,
    env: dict[str, str] | None = None,
    ranks: list[int] | None = None,
) -> list[Node]:
    """`nodekit up` on every host (or those of ``ranks``) at once, each from its own copy of the project."""
    nodes = []
    for rank, host in enumerate(cluster.hosts):
        if ranks is not None and rank not in ranks:
            continue
        project = host_project(demo, host, base)
        argv = nodekit_argv(
            "up", "--node-rank", str(rank), "--main", cluster.main.addr, "--nnodes", str(len(cluster.hosts)),
            "--config", str(project / "nodekit.toml"),
        )  # fmt: skip
        if image and rank in image:
            argv += ["--image", image[rank]]
        log = base / f"node-{rank}.log"
        proc = host.popen(*argv, env=env, cwd=project, log=log)
        nodes.append(Node(rank=rank, host=host, project=project, proc=proc, log=log))
    return nodes


def wait_all(nodes: list[Node], timeout: float, started: float | None = None) -> None:
    started = started or time.monotonic()
    deadline = started + timeout
    for n in nodes:
        try:
            n.code = n.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.code = n.proc.wait()
            n.code = None
        n.seconds = time.monotonic() - started


def report(nodes: list[Node]) -> str:
    parts = []
    for n in nodes:
        tail = "\n".join(n.output().splitlines()[-25:])
        parts.append(
            f"--- node {n.rank} on {n.host.name} ({n.host.addr}): exit {n.code} after {n.seconds:.0f} s\n{tail}"
        )
    return "\n".join(parts)


def environment(compose: dict[str, object]) -> dict[str, str]:
    services = compose["services"]
    assert isinstance(services, dict)
    (service,) = services.values()
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_image_pushed_from_host0_then_a_three_node_job(
    demo_on_main: Demo, cluster: Cluster, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    demo = demo_on_main
    h0, h1, h2 = cluster.hosts
    assert h0.image_id(demo.ref) == demo.image_id
    for h in (h1, h2):
        if h.image_id(demo.ref):
            h.docker("rmi", "-f", demo.ref)
        assert h.image_id(demo.ref) is None

    t0 = time.monotonic()
    pushed = h0.run(
        *nodekit_argv("push", demo.ref, "--to", f"h1={h1.docker_host}", "--to", f"h2={h2.docker_host}"), timeout=600
    )
    push_s = time.monotonic() - t0
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert h1.image_id(demo.ref) == demo.image_id and h2.image_id(demo.ref) == demo.image_id
    record_property("push_seconds", round(push_s, 1))
    print(f"push of {demo.ref} to 2 hosts: {push_s:.1f} s")

    t0 = time.monotonic()
    nodes = start_job(cluster, demo, tmp_path)
    wait_all(nodes, timeout=420, started=t0)
    record_property("job_seconds", round(time.monotonic() - t0, 1))
    print(f"3-node job: {time.monotonic() - t0:.1f} s")
    assert [n.code for n in nodes] == [0, 0, 0], report(nodes)

    result = json.loads((nodes[0].project / "outputs" / "result.json").read_text())
    assert result["world_size"] == 3 and len(result["checksums"]) == 3
    assert result["checksums_equal"] is True and len(set(result["checksums"])) == 1, result
    for n in nodes:
        env = environment(n.compose())
        # Each host names its interface differently (net0, eth1, ens5): the file carries none, the launcher
        # resolves it on the node, toward main, past the decoy that holds the default route.
        assert "GLOO_SOCKET_IFNAME" not in env, f"node {n.rank}: {env}"
        assert f"| iface {n.host.iface} |" in n.output(), report([n])
        assert "decoy0" not in json.dumps(n.compose()) and "decoy0" not in n.output()
        assert n.host.running_containers() == []


def test_a_different_image_on_one_host_is_refused_on_every_node(
    demo_everywhere: Demo, cluster: Cluster, tmp_path: Path
) -> None:
    """Node 1 starts only after main has reported the mismatch: the CI flake was such a late node finding main
    gone and retrying until its own rdzv_timeout (exit 18 after minutes). Main keeps serving the verdict now."""
    h2 = cluster.hosts[2]
    other = tampered_image(h2, demo_everywhere.ref)
    try:
        started = time.monotonic()
        early = start_job(cluster, demo_everywhere, tmp_path, image={2: other}, ranks=[0, 2])
        while "stack mismatch" not in early[0].output() and early[0].proc.poll() is None:
            assert time.monotonic() - started < 180, report(early)
            time.sleep(0.2)
        reported = time.monotonic() - started
        late_start = time.monotonic()
        (late,) = start_job(cluster, demo_everywhere, tmp_path, ranks=[1])
        nodes = sorted([*early, late], key=lambda n: n.rank)
        wait_all(nodes, timeout=240, started=started)
        late_s = time.monotonic() - late_start
    finally:
        h2.docker("rm", "-f", *h2.docker("ps", "-aq").stdout.split(), check=False)
        h2.docker("rmi", other, check=False)  # it shares layers with the demo image: later pushes would be cheaper
    assert [n.code for n in nodes] == [EXIT_STACK_MISMATCH] * 3, report(nodes)
    print(f"mismatch reported by node 0 after {reported:.1f} s; late node 1 ended {late_s:.1f} s after its start; "
          f"every node done after {max(n.seconds for n in nodes):.1f} s")  # fmt: skip
    assert "this node arrived after main had decided" in late.output(), report([late])
    assert late_s < 90, f"the late node took {late_s:.0f} s to learn the verdict"
    for n in nodes:
        out = n.output()
        assert "fingerprint" in out and "stack mismatch" in out, report([n])
        assert "f" * 12 in out, f"node {n.rank} does not show the differing fingerprint:\n{out[-3000:]}"
        assert n.host.running_containers() == []
    assert not (nodes[0].project / "outputs" / "result.json").exists()


def test_main_unreachable_from_one_host_ends_with_the_diagnosis(
    demo_everywhere: Demo, cluster: Cluster, tmp_path: Path
) -> None:
    h0, _, h2 = cluster.hosts
    h2.block(h0.addr, [MASTER_PORT, PREFLIGHT_PORT])
    timeout = 20
    t0 = time.monotonic()
    nodes = start_job(cluster, demo_everywhere, tmp_path, env={"NODEKIT_RDZV_TIMEOUT": str(timeout)})
    wait_all(nodes, timeout=timeout + 150, started=t0)
    assert nodes[2].code == EXIT_RENDEZVOUS, report(nodes)
    out = nodes[2].output()
    assert f"cannot reach main {h0.addr}:{PREFLIGHT_PORT}" in out, report([nodes[2]])
    assert nodes[2].seconds < timeout + 90, f"node 2 took {nodes[2].seconds:.0f} s"
    # Main waited for node 2 and names it; nobody trained.
    assert nodes[0].code == EXIT_RENDEZVOUS, report(nodes)
    assert "never arrived" in nodes[0].output() and "2" in nodes[0].output()
    assert not (nodes[0].project / "outputs" / "result.json").exists()
    for n in nodes:
        assert n.host.running_containers() == []


def _ip(hex_addr: str) -> str:
    return ".".join(str(b) for b in reversed(bytes.fromhex(hex_addr)))


def _mesh_connected(host: Host, peers: list[Host]) -> bool:
    """The host has established TCP connections to every peer outside the rendezvous ports: gloo's full mesh,
    built by init_process_group. Read from the namespace's own TCP table."""
    inode = netns_inode(host.netns_path)
    pids = pids_in_netns(inode) if inode else []
    if not pids:
        return False
    try:
        table = Path(f"/proc/{pids[0]}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    reached = set()
    for row in table:
        local, remote, state = row.split()[1:4]
        lport, (rip, rport) = int(local.split(":")[1], 16), remote.split(":")
        if state == "01" and {lport, int(rport, 16)}.isdisjoint({MASTER_PORT, PREFLIGHT_PORT}):
            reached.add(_ip(rip))
    return {p.addr for p in peers} <= reached


HEARTBEAT = r"no heartbeat for \d+ s; "


def lost_line(out: str, rank: int, addr: str, why: str = HEARTBEAT) -> str | None:
    """The watchdog's line naming node ``rank`` at ``addr`` as lost for the reason ``why`` (a regex), if the output
    has one."""
    pattern = rf"nodekit: node {rank} \({re.escape(addr)}, host [^)]*\) lost: {why}[^\n]*"
    found = re.search(pattern, out)
    return found.group(0) if found else None


def wait_in_training(cluster: Cluster, nodes: list[Node]) -> None:
    """Until every host has gloo's full mesh up (init_process_group done), then past DDP's first broadcast."""
    deadline = time.monotonic() + 240
    while not all(_mesh_connected(h, [p for p in cluster.hosts if p is not h]) for h in cluster.hosts):
        assert time.monotonic() < deadline and all(n.proc.poll() is None for n in nodes), report(nodes)
        time.sleep(0.5)
    time.sleep(3)
    assert all(n.proc.poll() is None for n in nodes), report(nodes)


def test_a_host_killed_mid_training_ends_the_others_promptly_naming_it(
    demo_everywhere: Demo, cluster: Cluster, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """The host dies with its processes: its peers see the connections close, so gloo fails on the survivors at once
    ("Connection closed by peer [172.31.250.12]"), and the watchdog names the node at once too, since the kernel
    closed its store connection without a done mark, or reset it (CLOSED_OR_CUT), not after NODEKIT_PEER_TIMEOUT of
    silence: exit 19."""
    h0, h1, h2 = cluster.hosts
    # Long enough that the kill lands in training; the process group timeout is far above what we allow below.
    env = {"NODEKIT_ARGS": json.dumps(["--epochs", "100000", "--pg-timeout", "600"])}
    nodes = start_job(cluster, demo_everywhere, tmp_path, env=env)
    wait_in_training(cluster, nodes)
    killed_at = time.monotonic()
    h2.stop()
    survivors = nodes[:2]
    wait_all(survivors, timeout=PEER_TIMEOUT + 90, started=killed_at)
    print(report(nodes))  # shown with -s: how the survivors name the lost node
    for n in survivors:
        record_property(f"node{n.rank}_exit_seconds_after_kill", round(n.seconds, 1))
        print(f"node {n.rank}: exit {n.code} {n.seconds:.1f} s after host 2 was killed")
    for n in survivors:
        assert n.code == EXIT_PEER_LOST, report(nodes)
        # Generous for a loaded 2-core machine; gloo's default timeout is 30 min, NCCL's 10.
        assert n.seconds < PEER_TIMEOUT + 45, f"node {n.rank} took {n.seconds:.0f} s"
        line = lost_line(n.output(), 2, h2.addr, CLOSED_OR_CUT)
        assert line, f"node {n.rank} does not name the lost node:\n{n.output()[-3000:]}"
        assert "the job exited with code 19" in n.output(), report([n])
        assert n.host.running_containers() == []
    nodes[2].proc.wait(timeout=10)
    inode = netns_inode(h2.netns_path)
    assert inode is not None and pids_in_netns(inode) == []
    assert os.path.exists(h0.sock) and os.path.exists(h1.sock)


def test_a_host_that_vanishes_silently_is_named_after_the_peer_timeout(
    demo_everywhere: Demo, cluster: Cluster, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """Power loss: the cable is cut before the processes die, so no peer ever sees a FIN or RST and gloo would wait
    out the collective timeout (here 600 s; torch's default 30 min). The watchdog ends the survivors once node 2's
    heartbeat has been silent for NODEKIT_PEER_TIMEOUT, naming it."""
    _, _, h2 = cluster.hosts
    peer_timeout = 10
    env = {
        "NODEKIT_ARGS": json.dumps(["--epochs", "100000", "--pg-timeout", "600"]),
        "NODEKIT_PEER_TIMEOUT": str(peer_timeout),
    }
    nodes = start_job(cluster, demo_everywhere, tmp_path, env=env)
    wait_in_training(cluster, nodes)
    assert environment(nodes[0].compose()).get("NODEKIT_PEER_TIMEOUT") == str(peer_timeout)
    killed_at = time.monotonic()
    h2.cut()
    h2.stop()
    survivors = nodes[:2]
    wait_all(survivors, timeout=peer_timeout + 90, started=killed_at)
    print(report(nodes))
    for n in survivors:
        record_property(f"node{n.rank}_exit_seconds_after_cut", round(n.seconds, 1))
        print(f"node {n.rank}: exit {n.code} {n.seconds:.1f} s after host 2 was cut off and killed")
    for n in survivors:
        assert n.code == EXIT_PEER_LOST, report(nodes)
        assert n.seconds < peer_timeout + 30, f"node {n.rank} took {n.seconds:.0f} s to notice"
        line = lost_line(n.output(), 2, h2.addr)
        assert line, f"node {n.rank} does not name the lost node:\n{n.output()[-3000:]}"
        assert n.host.running_containers() == []
