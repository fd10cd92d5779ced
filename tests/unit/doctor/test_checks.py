"""Doctor rows from facts: every fact comes in as data; nothing here touches Docker, the network or /proc."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodekit import doctor as doc
from nodekit.config.settings import NodeOverride, Settings
from nodekit.doctor import CheckRow, ContainerView, DoctorFacts, EngineCheck, ImageCheck, Status
from nodekit.doctor.handshake import Arrival, Probe, Reach
from nodekit.errors import UsageError
from nodekit.system.host.facts import Firewall, HostFacts
from nodekit.system.host.net import Route

GIB = 1024**3


def settings(**kw: Any) -> Settings:
    return Settings(project_dir=Path("/srv/project"), **({"name": "demo", "nnodes": 2} | kw))  # type: ignore[arg-type]


ENGINE = EngineCheck(
    server="26.1.5", compose="Docker Compose version v2.26.1", buildx="github.com/docker/buildx 0.13.1"
)
FRESH = DoctorFacts(
    settings=settings(nnodes=1),
    rank=None,
    host=HostFacts(memlock_hard=8 * 1024 * 1024),
    port_range=(32768, 60999),
    reserved="",
    firewall=Firewall(),
    hostname="vm",
    hostname_addrs=("127.0.0.1",),
    engine=ENGINE,
    image=ImageCheck(error="no image built yet for demo", fix="nodekit build"),
    containers=doc.ContainerCheck(note="no image built"),
    host_shm=16 * GIB,
    host_nofile=1048576,
)
ETH0 = Route(dest="10.0.0.5", iface="eth0", src="10.0.0.6")


def worker(*probes: Probe, **kw: Any) -> DoctorFacts:
    base: dict[str, Any] = {"settings": settings(), "rank": 1, "main": "10.0.0.5", "main_ip": "10.0.0.5"}
    return replace(FRESH, **(base | {"route": ETH0, "mtu": 1500, "probes": probes} | kw))


def main_node(**kw: Any) -> DoctorFacts:
    route = Route(dest="10.0.0.5", iface="eth0", src="10.0.0.5", local=True)
    base: dict[str, Any] = {"settings": settings(), "rank": 0, "main": "10.0.0.5", "main_ip": "10.0.0.5"}
    return replace(FRESH, **(base | {"route": route, "mtu": 1500, "main_is_here": True} | kw))


def row(rows: list[CheckRow], check: str) -> CheckRow:
    found = [r for r in rows if r.check == check]
    assert len(found) == 1, [r.check for r in rows]
    return found[0]


def probe(reach: Reach, port: int = 29500, **kw: Any) -> Probe:
    return Probe("10.0.0.5", port, reach, **kw)


def doctor_answer(port: int, offset: float = 0.0) -> Probe:
    return probe(
        Reach.DOCTOR,
        port,
        rtt_s=0.0004,
        clock_offset_s=offset,
        offset_error_s=0.0002,
        peer={"host": "main", "mtu": "1500"},
    )


def test_fresh_cpu_machine_without_main() -> None:
    rows = doc.rows(FRESH)
    assert doc.exit_code(rows) == 0
    assert row(rows, "gpus").status is Status.SKIP and "CPU-only" in row(rows, "gpus").detail
    assert row(rows, "main").status is Status.SKIP
    assert row(rows, "compose v2").detail == "Compose 2.26.1" and row(rows, "buildx").detail == "Buildx 0.13.1"
    assert row(rows, "image").status is Status.WARN and row(rows, "image").fix == "nodekit build"
    assert "predicted from the host (no image built)" in row(rows, "ulimits").detail
    for r in rows:
        assert r.status not in (Status.WARN, Status.FAIL) or r.fix, r


def test_no_engine() -> None:
    rows = doc.rows(
        replace(FRESH, engine=EngineCheck(error="no Docker engine answers", fix="make engine", failed="engine"))
    )
    assert row(rows, "docker engine") == CheckRow(
        "docker engine", Status.FAIL, "no Docker engine answers", "make engine"
    )
    assert row(rows, "compose v2").status is Status.SKIP and row(rows, "buildx").status is Status.SKIP
    assert doc.exit_code(rows) == 1


def test_compose_missing() -> None:
    e = EngineCheck(
        server="26.1",
        error="Docker Compose v2 (the `docker compose` plugin) is missing",
        fix="make engine",
        failed="compose",
    )
    rows = doc.rows(replace(FRESH, engine=e))
    assert row(rows, "docker engine").status is Status.PASS and row(rows, "compose v2").status is Status.FAIL


def test_compose_v1_fails() -> None:
    rows = doc.rows(replace(FRESH, engine=replace(ENGINE, compose="docker-compose version 1.29.2")))
    assert row(rows, "compose v2").status is Status.FAIL


GPU_HOST = HostFacts(gpu_count=2, gpu_models=("NVIDIA H100 80GB HBM3",) * 2)


def test_gpus_visible_in_container() -> None:
    view = ContainerView(
        image="nodekit/demo:abc", gpus=("GPU 0: H100", "GPU 1: H100"), stack=64 * 1024**2, nofile=1 << 20
    )
    rows = doc.rows(replace(FRESH, host=GPU_HOST, containers=doc.ContainerCheck(view=view), toolkit=True))
    assert row(rows, "gpus").detail == "2 x NVIDIA H100 80GB HBM3"
    assert row(rows, "gpus in container").status is Status.PASS


def test_gpus_without_runtime() -> None:
    err = 'a test container failed: could not select device driver "" with capabilities: [[gpu]]'
    rows = doc.rows(replace(FRESH, host=GPU_HOST, containers=doc.ContainerCheck(gpu_error=err), toolkit=False))
    r = row(rows, "gpus in container")
    assert r.status is Status.FAIL and "nvidia-container-toolkit" in (r.fix or "")


def test_gpus_without_toolkit_and_no_image() -> None:
    r = row(doc.rows(replace(FRESH, host=GPU_HOST, toolkit=False)), "gpus in container")
    assert r.status is Status.FAIL and "toolkit" in r.detail
    r = row(doc.rows(replace(FRESH, host=GPU_HOST, toolkit=True)), "gpus in container")
    assert r.status is Status.SKIP and "no image built" in r.detail


def test_worker_reaches_main_doctor() -> None:
    rows = doc.rows(worker(doctor_answer(29500), doctor_answer(29501)))
    r = row(rows, "reach main")
    assert r.status is Status.PASS and "29500: doctor answered in 0.4 ms" in r.detail
    assert row(rows, "clock").status is Status.PASS
    assert row(rows, "interface to main").detail.startswith("eth0 from 10.0.0.6, MTU 1500")
    assert doc.exit_code(rows) == 0


def test_port_closed_is_told_apart_from_filtered_and_unreachable() -> None:
    closed = row(doc.rows(worker(probe(Reach.REFUSED), doctor_answer(29501))), "reach main")
    filtered = row(doc.rows(worker(probe(Reach.TIMEOUT), doctor_answer(29501))), "reach main")
    unreachable = row(doc.rows(worker(probe(Reach.UNREACHABLE, detail="No route to host"))), "reach main")
    assert all(r.status is Status.FAIL for r in (closed, filtered, unreachable))
    assert "port closed" in closed.detail and "--listen" in (closed.fix or "")
    assert "timed out" in filtered.detail and "iptables -I INPUT -p tcp --dport 29500:29501 -j ACCEPT" in (
        filtered.fix or ""
    )
    assert 'ip_local_port_range="50000 51000"' in (filtered.fix or "")
    assert "host unreachable" in unreachable.detail and (unreachable.fix or "").startswith("ip route get 10.0.0.5")


def test_timeout_fix_uses_ufw_when_it_is_active() -> None:
    r = row(doc.rows(worker(probe(Reach.TIMEOUT), firewall=Firewall(ufw="active"))), "reach main")
    assert "sudo ufw allow 29500:29501/tcp" in (r.fix or "") and "sudo ufw allow 50000:51000/tcp" in (r.fix or "")


def test_something_else_on_the_port() -> None:
    r = row(doc.rows(worker(probe(Reach.OPEN), probe(Reach.OPEN, 29501))), "reach main")
    assert r.status is Status.WARN and "not as a nodekit doctor" in r.detail


def test_loopback_main_on_a_worker_that_is_not_main_machine() -> None:
    f = worker(
        probe(Reach.REFUSED),
        main="127.0.0.1",
        main_ip="127.0.0.1",
        main_is_here=True,
        route=Route(dest="127.0.0.1", iface="lo", src="127.0.0.1", local=True),
    )
    rows = doc.rows(f)
    assert "all-local run" in row(rows, "main").detail
    assert "node 0 must run on this same machine" in row(rows, "reach main").detail
    assert row(rows, "clock").detail == "main is this machine: same clock"


def test_loopback_main_contradicted_by_config() -> None:
    f = worker(main="127.0.0.1", main_ip="127.0.0.1", settings=settings(nodes={1: NodeOverride(addr="10.0.0.6")}))
    r = row(doc.rows(f), "main")
    assert r.status is Status.FAIL and "10.0.0.6" in r.detail


def test_unresolvable_main() -> None:
    err = UsageError("main address 'nope' is neither an IP address nor a resolvable host name", fix="pass --main IP")
    r = row(doc.rows(worker(main="nope", main_ip=None, main_error=err)), "main")
    assert r.status is Status.FAIL and r.fix == "pass --main IP"


def test_no_route_to_main() -> None:
    rows = doc.rows(worker(route=None, mtu=None))
    assert row(rows, "interface to main").status is Status.FAIL
    assert row(rows, "reach main").status is Status.SKIP


def test_clock_skew() -> None:
    r = row(doc.rows(worker(doctor_answer(29500, offset=4.2), doctor_answer(29501, offset=4.2))), "clock")
    assert r.status is Status.WARN and r.fix == "sudo timedatectl set-ntp true" and "+4.200 s" in r.detail


def test_mtu_mismatch_with_main() -> None:
    answer = replace(doctor_answer(29500), peer={"host": "main", "mtu": "9001"})
    r = row(doc.rows(worker(answer, answer)), "interface to main")
    assert r.status is Status.WARN and r.fix is not None and r.fix.startswith("sudo ip link set dev eth0 mtu 9001")


def test_interface_override_is_shown() -> None:
    f = worker(settings=settings(nodes={1: NodeOverride(iface="ens5")}))
    assert "ens5 ([nodes.1] iface; detected eth0)" in row(doc.rows(f), "interface to main").detail


def test_hostname_on_loopback_matters_only_across_machines() -> None:
    f = worker(hostname="gpu7", hostname_addrs=("127.0.1.1",))
    r = row(doc.rows(f), "host name")
    assert r.status is Status.WARN and r.fix == "sudo sed -i '1i 10.0.0.6 gpu7' /etc/hosts"
    local = replace(f, main="127.0.0.1", main_ip="127.0.0.1", main_is_here=True)
    assert row(doc.rows(local), "host name").status is Status.PASS


def test_main_ports_free_and_taken() -> None:
    assert row(doc.rows(main_node()), "ports on main").status is Status.PASS
    rows = doc.rows(main_node(holders=((29500, "python3 (pid 4242)"), (29501, None))))
    taken = [r for r in rows if r.check == "ports on main"]
    assert [r.status for r in taken] == [Status.FAIL, Status.FAIL]
    assert "in use by python3 (pid 4242)" in taken[0].detail and (taken[0].fix or "").startswith("kill 4242")
    assert (taken[1].fix or "").startswith("sudo ss -tlnp 'sport = :29501'")


def test_node_zero_whose_main_is_elsewhere() -> None:
    r = row(doc.rows(main_node(main_is_here=False)), "main")
    assert r.status is Status.WARN and "not an address of this machine" in r.detail


def test_master_port_inside_the_ephemeral_range() -> None:
    f = replace(FRESH, settings=settings(master_port=40000))
    r = row(doc.rows(f), "port range")
    assert r.status is Status.WARN and r.fix == "sudo sysctl -w net.ipv4.ip_local_reserved_ports=40000-40001"
    assert row(doc.rows(replace(f, reserved="40000-40001")), "port range").status is Status.PASS


@pytest.mark.parametrize(
    ("fw", "status", "needle"),
    [
        (Firewall(ufw="active"), Status.WARN, "sudo ufw allow 29500:29501/tcp"),
        (Firewall(iptables_policy="DROP"), Status.WARN, "sudo iptables -I INPUT -p tcp --dport 29500:29501 -j ACCEPT"),
        (Firewall(iptables_policy="ACCEPT", iptables_blocks=True), Status.WARN, "--dport 50000:51000"),
        (Firewall(ufw="inactive", iptables_policy="ACCEPT"), Status.PASS, None),
        (Firewall(readable=False), Status.SKIP, "if a firewall is on"),
    ],
)
def test_firewall(fw: Firewall, status: Status, needle: str | None) -> None:
    r = row(doc.rows(replace(FRESH, firewall=fw)), "firewall")
    assert r.status is status
    if needle:
        assert needle in (r.fix or "")


def test_infiniband_rows() -> None:
    ib = ("/dev/infiniband/uverbs0",)
    capped = row(doc.rows(replace(FRESH, host=HostFacts(infiniband=ib, memlock_hard=65536))), "infiniband")
    assert capped.status is Status.FAIL and "LimitMEMLOCK=infinity" in (capped.fix or "")
    assert row(doc.rows(replace(FRESH, host=HostFacts(infiniband=ib))), "infiniband").status is Status.PASS
    off = row(doc.rows(replace(FRESH, host=HostFacts(infiniband=ib), settings=settings(ib="off"))), "infiniband")
    assert off.status is Status.WARN
    forced = row(doc.rows(replace(FRESH, settings=settings(ib="on"))), "infiniband")
    assert forced.status is Status.FAIL and "no /dev/infiniband" in forced.detail
    assert "NCCL_IB_DISABLE=1" in row(doc.rows(FRESH), "infiniband").detail


def test_small_shm_and_low_nofile_in_the_container() -> None:
    view = ContainerView(image="img", memlock=8 << 20, stack=64 << 20, nofile=1024, shm=64 << 20)
    rows = doc.rows(replace(FRESH, containers=doc.ContainerCheck(view=view)))
    assert (
        row(rows, "shared memory").status is Status.WARN
        and "64 MiB in the container" in row(rows, "shared memory").detail
    )
    r = row(rows, "ulimits")
    assert (
        r.status is Status.WARN and "nofile 1024 in a container of img" in r.detail and "LimitNOFILE" in (r.fix or "")
    )


def test_container_refused_a_limit() -> None:
    err = "a test container failed: error setting rlimit type 8: operation not permitted"
    r = row(doc.rows(replace(FRESH, containers=doc.ContainerCheck(error=err))), "ulimits")
    assert r.status is Status.FAIL and "LimitMEMLOCK=infinity" in (r.fix or "")


def test_image_rows() -> None:
    ok = ImageCheck(ref="nodekit/demo:0123456789ab", present=True, fingerprint="0123456789ab" + "f" * 52)
    assert row(doc.rows(replace(FRESH, image=ok)), "image").status is Status.PASS
    stale = replace(ok, fingerprint="ffff")
    assert row(doc.rows(replace(FRESH, image=stale)), "image").status is Status.WARN
    unlabeled = replace(ok, fingerprint=None)
    assert "no nodekit fingerprint" in row(doc.rows(replace(FRESH, image=unlabeled)), "image").detail


def test_bridge_mode_rows() -> None:
    cross = worker(settings=settings(network="bridge"))
    r = row(doc.rows(cross), "network mode")
    assert r.status is Status.FAIL and "NAT" in r.detail
    local = main_node(
        settings=settings(network="bridge"),
        main="127.0.0.1",
        main_ip="127.0.0.1",
        host=HostFacts(bridge_gateway="172.17.0.1"),
    )
    assert "publishes 29500-29501 on docker0 172.17.0.1" in row(doc.rows(local), "network mode").detail


def test_parse_container_probe() -> None:
    text = (
        "memlock unlimited\nstack 65536\nnofile 1048576\n"
        "shm tmpfs 24684092 0 24684092 0% /dev/shm\n"
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
    )
    view = doc.parse_container_probe("img", text)
    assert view == ContainerView(
        image="img",
        memlock=None,
        stack=64 << 20,
        nofile=1048576,
        shm=24684092 * 1024,
        gpus=tuple(text.splitlines()[4:]),
    )


def test_arrivals() -> None:
    def arrival(rank: int, port: int) -> Arrival:
        return Arrival(port=port, peer="10.0.0.6", fields={"rank": str(rank)})

    ports = (29500, 29501)
    everyone = [arrival(1, 29500), arrival(1, 29501), arrival(2, 29500), arrival(2, 29501)]
    assert doc.arrivals_row(everyone, nnodes=3, ports=ports, seconds=2).status is Status.PASS
    r = doc.arrivals_row(everyone[:3], nnodes=4, ports=ports, seconds=60, main_ip="10.0.0.5")
    assert r.status is Status.FAIL and "node 3 missing" in r.detail and "node 2 not on port 29501" in r.detail
    assert "--main 10.0.0.5" in (r.fix or "")
    assert doc.arrivals_row([], nnodes=1, ports=ports, seconds=5).status is Status.WARN
    anonymous = Arrival(port=29500, peer="10.0.0.9", fields={"rank": "None"})
    r = doc.arrivals_row([anonymous], nnodes=1, ports=ports, seconds=5)
    assert r.status is Status.WARN and "from 10.0.0.9 without --node-rank" in r.detail


# --- the command line ------------------------------------------------------------------------------------------------

runner = CliRunner()


def invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, facts: DoctorFacts, *args: str) -> Any:
    from nodekit.cli.app import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doc, "gather", lambda settings, **_: replace(facts, settings=settings))
    return runner.invoke(app, ["doctor", *args])


def test_cli_json_and_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = invoke(monkeypatch, tmp_path, worker(probe(Reach.REFUSED)), "--json", "--main", "10.0.0.5", "-r", "1")
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["ok"] is False
    reach = next(r for r in payload["rows"] if r["check"] == "reach main")
    assert reach["status"] == "FAIL" and "--listen" in reach["fix"]


def test_cli_table_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = invoke(monkeypatch, tmp_path, FRESH)
    assert result.exit_code == 0, result.output
    assert "SKIP  gpus" in result.stdout and "fix: nodekit build" in result.stdout


def test_cli_listen_is_for_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = invoke(monkeypatch, tmp_path, worker(), "--main", "10.0.0.5", "-r", "1", "--listen", "5")
    assert result.exit_code == 2 and "--listen is for main" in result.stderr
