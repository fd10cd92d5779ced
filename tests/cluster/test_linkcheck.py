"""The link check on four hosts over real SSH, in one cluster: a healthy cluster passes `nodekit doctor --fleet`
with every pair in the matrix; then host 3's veth is slowed with tc (both ends: its own egress and the switch's
port toward it), and `nodekit doctor --fleet` names the three pairs with host 3 (both nodes, their interfaces,
the figures) while the other pairs pass; and a real `nodekit run` with [health] links = "refuse" stops in the
preflight with exit 20, naming the same pairs, before any worker starts."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, sh, ssh_client
from tests.cluster.helpers import Demo, Fleet, SshKeys, nodekit_argv, push_image
from tests.conftest import cluster_name

pytestmark = [pytest.mark.cluster, pytest.mark.docker]
RATE = "100mbit"  # host 3's link; the veths between the others carry gigabits


@pytest.fixture
def fleet4(
    cluster_ready: None, demo_on_main: Demo, ssh_keys: SshKeys, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Fleet]:
    """Four fresh hosts of the test's cluster name (its group's: host 0's data root holds the demo image that
    demo_on_main put there) with an sshd each, as the `fleet` fixture makes three."""
    c = Cluster(4, name=cluster_name(request.node.nodeid), owner=os.getpid())
    c.up()
    d = tmp_path / "ssh"
    try:
        bin_dir = ssh_client(d, c.hosts, ssh_keys.client_key, ssh_keys.public(ssh_keys.host_key))
        for h in c.hosts:
            h.start_sshd(ssh_keys.public(ssh_keys.client_key), ssh_keys.host_key)
        yield Fleet(cluster=c, keys=ssh_keys, config=d / "ssh_config", bin=bin_dir)
    finally:
        for h in c.hosts:
            h.stop_sshd()
        c.down()


def doctor(fleet: Fleet, project: Path, image: str, log: Path) -> tuple[int, str]:
    argv = nodekit_argv("doctor", "--fleet", "--image", image, "--config", str(project / "nodekit.toml"))
    return wait(fleet.cluster.main.popen(*argv, env=fleet.env, cwd=project, log=log), log)


def wait(proc: subprocess.Popen[str], log: Path, timeout: float = 300) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"did not end within {timeout:.0f} s:\n{log.read_text()[-4000:]}") from None
    return code, log.read_text(errors="replace")


def pair_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if "<->" in ln]


def test_a_slowed_host_is_named_by_doctor_fleet_and_refused_by_the_preflight(
    demo_on_main: Demo, fleet4: Fleet, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    c = fleet4.cluster
    push_image(demo_on_main.ref, c.main.docker_host, c.hosts[1:])
    project = fleet4.project(demo_on_main, tmp_path)

    t0 = time.monotonic()
    code, out = doctor(fleet4, project, demo_on_main.ref, tmp_path / "healthy.log")
    record_property("doctor_fleet_healthy_s", round(time.monotonic() - t0, 1))
    print(out)  # the matrix, kept in the test's report
    assert code == 0, out[-5000:]
    assert "nodekit link check: ok, 4 nodes, 6 pair(s)" in out, out[-5000:]
    assert "no training started" in out and not (project / "outputs" / "result.json").exists()
    for h in c.hosts:  # the matrix's legend: every node with its own interface toward main
        assert f"node {h.index} (" in out and f", {h.addr}, {h.iface})" in out, out[-3000:]
    assert not pair_lines(out)

    slow = c.hosts[3]
    for ns, dev in ((slow.netns, slow.iface), (c.switch, slow.name)):
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", RATE, "burst", "256kb", "latency", "50ms")
    t0 = time.monotonic()
    code, out = doctor(fleet4, project, demo_on_main.ref, tmp_path / "slowed.log")
    record_property("doctor_fleet_slowed_s", round(time.monotonic() - t0, 1))
    print(out)
    assert code == 0, out[-5000:]  # links = "warn": named, not refused
    assert "nodekit link check: WARNING, 3 pair(s) named" in out, out[-5000:]
    named = pair_lines(out)
    # Host names are the machine's own (the hosts share its UTS namespace); addresses and interfaces are each host's.
    assert len(named) == 3 and all(f"{slow.addr}, {slow.iface})" in ln for ln in named), out[-5000:]
    for h in c.hosts[:3]:  # each healthy host once, as the other end
        assert sum(f"{h.addr}, {h.iface}) <-> node 3 (" in ln for ln in named) == 1, out[-5000:]
    for ln in named:
        a, b = re.findall(r"([\d.]+) Gbit/s \d->\d", ln)
        assert float(a) < 0.2 and float(b) < 0.2, ln  # 100 Mbit/s each way, in Gbit/s
    assert "likely cause: node 3 (" in out and f"{slow.addr}, {slow.iface}) is in every named pair" in out
    assert f"`tc qdisc show dev {slow.iface}`" in out

    (project / "nodekit.toml").write_text((project / "nodekit.toml").read_text() + '\n[health]\nlinks = "refuse"\n')
    log = tmp_path / "run.log"
    t0 = time.monotonic()
    code, out = wait(fleet4.run(project, "--image", demo_on_main.ref, log=log), log)
    record_property("run_refused_s", round(time.monotonic() - t0, 1))
    assert code == 20, out[-5000:]
    assert "nodekit link check: REFUSED, 3 pair(s) named: no node starts training (exit 20)" in out, out[-5000:]
    assert len({ln.split("]", 1)[-1] for ln in pair_lines(out)}) == 3
    assert not (project / "outputs" / "result.json").exists()
    for h in c.hosts:
        assert h.docker("ps", "-aq").stdout.split() == [], f"{h.name} kept a container"
