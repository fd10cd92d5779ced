"""Network facts and decisions: route/interface parsing and choice (facts as data), ports on this host (real
sockets on loopback), and what spec/render make of them (InfiniBand, bridge networking, loopback main, --debug).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nodekit.backends.compose.render import render_compose, to_yaml
from nodekit.config.settings import NodeOverride, Settings
from nodekit.doctor import handshake
from nodekit.doctor.handshake import Reach
from nodekit.errors import UsageError
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.system.host import facts as host_facts
from nodekit.system.host import net
from nodekit.system.host.facts import HostFacts
from nodekit.system.host.net import Route
from tests.golden import GOLDEN, update_golden

# --- `ip -j route get` samples (as iproute2 prints them) -----------------------------------------------------

VIA_GATEWAY = '[{"dst":"10.0.0.5","gateway":"192.0.2.1","dev":"eth0","prefsrc":"192.0.2.2","flags":[],"uid":0}]'
# A multi-homed node: the default route (and the "first non-loopback interface") is eth0, a decoy; main's subnet
# is on ens5. The kernel's answer names ens5, and that is what must be chosen.
ON_LINK_ENS5 = '[{"dst":"10.1.0.5","dev":"ens5","prefsrc":"10.1.0.7","flags":[],"uid":0,"cache":[]}]'
LOOPBACK = '[{"type":"local","dst":"127.0.0.1","dev":"lo","prefsrc":"127.0.0.1","flags":[],"uid":0,"cache":["local"]}]'
OWN_ADDRESS = '[{"type":"local","dst":"192.0.2.2","dev":"lo","prefsrc":"192.0.2.2","flags":[],"cache":["local"]}]'
IPV6 = '[{"dst":"fd00::5","from":"::","dev":"eth0","protocol":"kernel","prefsrc":"fd00::2","metric":256,"flags":[]}]'
UNREACHABLE = '[{"type":"unreachable","dst":"198.51.100.7","flags":[],"uid":0}]'
BLACKHOLE = '[{"type":"blackhole","dst":"198.51.100.7","dev":"lo","flags":[]}]'
NO_SRC = '[{"dst":"10.1.0.5","dev":"ens5","flags":[]}]'

IP_ADDR = """[
 {"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"operstate":"UNKNOWN",
  "addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8},{"family":"inet6","local":"::1","prefixlen":128}]},
 {"ifindex":2,"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":1500,"operstate":"UP",
  "addr_info":[{"family":"inet","local":"192.0.2.2","prefixlen":24}]},
 {"ifindex":3,"ifname":"ens5","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":9001,"operstate":"UP",
  "addr_info":[{"family":"inet","local":"10.1.0.7","prefixlen":16}]},
 {"ifindex":4,"ifname":"docker0","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"],"mtu":1500,"operstate":"DOWN",
  "addr_info":[{"family":"inet","local":"172.17.0.1","prefixlen":16}]},
 {"ifindex":5,"ifname":"ifb0","flags":["BROADCAST","NOARP"],"mtu":1500,"operstate":"DOWN","addr_info":[]}
]"""
LINKS = net.parse_ip_addr(IP_ADDR)


def choose(route_json: str, main: str) -> Route | None:
    return net.interface_toward(main, net.parse_ip_route_get(route_json), LINKS)


def test_parse_links() -> None:
    assert [(x.name, x.mtu) for x in LINKS] == [
        ("lo", 65536),
        ("eth0", 1500),
        ("ens5", 9001),
        ("docker0", 1500),
        ("ifb0", 1500),
    ]
    assert LINKS[0].addrs == ("127.0.0.1", "::1")
    assert not LINKS[4].up and LINKS[4].addrs == ()
    assert host_facts.bridge_gateway(LINKS) == "172.17.0.1"
    assert host_facts.bridge_gateway(LINKS[:3]) is None


def test_route_via_gateway() -> None:
    assert choose(VIA_GATEWAY, "10.0.0.5") == Route(dest="10.0.0.5", iface="eth0", src="192.0.2.2")


def test_the_interface_that_reaches_main_not_the_default_one() -> None:
    assert choose(ON_LINK_ENS5, "10.1.0.5") == Route(dest="10.1.0.5", iface="ens5", src="10.1.0.7")


def test_loopback_main_is_lo_for_all_local_runs() -> None:
    route = choose(LOOPBACK, "127.0.0.1")
    assert route is not None and (route.iface, route.src, route.local) == ("lo", "127.0.0.1", True)


def test_main_own_address_is_its_interface_not_lo() -> None:
    # On main itself `ip route get <own address>` says dev lo; gloo/NCCL bound to lo would advertise 127.0.0.1.
    assert choose(OWN_ADDRESS, "192.0.2.2") == Route(dest="192.0.2.2", iface="eth0", src="192.0.2.2", local=True)


def test_ipv6_route() -> None:
    assert choose(IPV6, "fd00::5") == Route(dest="fd00::5", iface="eth0", src="fd00::2")


def test_missing_source_is_taken_from_the_interface() -> None:
    assert choose(NO_SRC, "10.1.0.5") == Route(dest="10.1.0.5", iface="ens5", src="10.1.0.7")


@pytest.mark.parametrize("text", [UNREACHABLE, BLACKHOLE, "[]", "", "not json", '[{"dst":"1.2.3.4"}]', "{}"])
def test_no_usable_route(text: str) -> None:
    assert net.parse_ip_route_get(text) is None
    assert choose(text, "198.51.100.7") is None


def test_route_to_loopback_on_this_host() -> None:
    # `ip route get` (or the socket fallback) sends nothing.
    route = net.route_to("127.0.0.1")
    assert route is not None and route.iface == "lo" and route.local


def test_ports_in_sysctl_lists() -> None:
    assert net.ports_in_spec("29500-29501, 8080") == {29500, 29501, 8080}
    assert net.ports_in_spec("") == set()
    assert net.ports_in_spec("junk,22") == {22}


# --- ports: parsers --------------------------------------------------------------------------------------------


SS = """\
LISTEN 0      4096         0.0.0.0:29500      0.0.0.0:*    users:(("python3",pid=4242,fd=7))
LISTEN 0      4096            [::]:29501         [::]:*    users:(("torchrun",pid=77,fd=3),("torchrun",pid=78,fd=3))
LISTEN 0      128        127.0.0.1:6000       0.0.0.0:*
LISTEN 0      4096               *:8080             *:*    users:(("docker-proxy",pid=9,fd=4))
"""


def test_parse_ss() -> None:
    found = net.parse_ss_listeners(SS)
    assert [(x.local, x.port, x.process, x.pid) for x in found] == [
        ("0.0.0.0", 29500, "python3", 4242),
        ("::", 29501, "torchrun", 77),
        ("127.0.0.1", 6000, None, None),
        ("*", 8080, "docker-proxy", 9),
    ]
    assert found[0].describe() == "python3 (pid 4242)"
    assert "sudo ss -tlnp 'sport = :6000'" in found[2].describe()


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1 0 100 0 0 10 0
   1: 0100007F:733D 0100007F:E6DE 01 00000000:00000000 00:00000000 00000000     0        0 5552 1 0 100 0 0 10 0
"""


def test_parse_proc_net_tcp_keeps_listeners_only() -> None:
    assert net.parse_proc_net_tcp(PROC_NET_TCP) == {29500: [5551]}


# --- ports: against real sockets on loopback ---------------------------------------------------------------------


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def test_port_in_use_and_its_holder(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    # Bound to 127.0.0.1 only, it still blocks the wildcard bind torch's store makes.
    assert net.port_in_use(port)
    holder = net.port_holder(port)
    assert holder is not None and f"pid {os.getpid()}" in holder
    listening.close()
    assert not net.port_in_use(port)
    assert net.port_holder(port) is None


def test_holder_from_proc_without_ss(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    assert net._holder_from_proc(port) == f"{Path('/proc/self/comm').read_text().strip()} (pid {os.getpid()})"


def test_ipv6_only_listener_blocks_the_port() -> None:
    try:
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with s:
        s.listen()
        port = s.getsockname()[1]
        assert net.port_in_use(port)
        assert not net.port_in_use(port, "127.0.0.1")  # only the IPv4 side asked


def test_time_wait_does_not_count_as_in_use() -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server side closes first: its end of the connection sits in TIME_WAIT on `port`
    cli.close()
    srv.close()
    assert not net.port_in_use(port)


def test_a_bound_but_not_listening_socket_counts() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert net.port_in_use(s.getsockname()[1])


# --- connection failures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "reach"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), Reach.REFUSED),
        (OSError(errno.EHOSTUNREACH, "No route to host"), Reach.UNREACHABLE),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), Reach.NO_ROUTE),
        (TimeoutError("timed out"), Reach.TIMEOUT),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), Reach.TIMEOUT),
        (OSError(errno.EPERM, "Operation not permitted"), Reach.ERROR),
    ],
)
def test_classify_connect_errors(exc: OSError, reach: Reach) -> None:
    assert handshake.classify_connect_error(exc) is reach


# --- what spec and render make of the facts ------------------------------------------------------------------------

CPU = HostFacts(iface="lo", local_addr="127.0.0.1", memlock_hard=8 * 1024 * 1024, bridge_gateway="172.17.0.1")
IB = ("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0")


def settings(**kw: object) -> Settings:
    base: dict[str, object] = {"name": "demo", "script": "train.py", "nnodes": 2, "nproc_per_node": 1}
    return Settings(project_dir=Path("/srv/project"), **(base | kw))  # type: ignore[arg-type]


def svc(s: Settings, rank: int, facts: HostFacts, main: str = "127.0.0.1", *, debug: bool = False) -> dict[str, object]:
    node = node_spec(s, launch_spec(s), rank, main, facts)
    doc = render_compose(
        plan_container(
            node, facts, image="nodekit/demo:0123456789ab", output_dir=Path("/srv/project/outputs"), debug=debug
        )
    )
    service: dict[str, object] = doc["services"]["train"]
    return service


def env(service: dict[str, object]) -> dict[str, str]:
    e = service["environment"]
    assert isinstance(e, dict)
    return e


def test_infiniband_present_is_passed_with_ipc_lock() -> None:
    s = svc(settings(), 1, CPU.model_copy(update={"infiniband": IB, "memlock_hard": None}), "10.0.0.5")
    assert s["devices"] == [f"{d}:{d}" for d in IB] and s["cap_add"] == ["IPC_LOCK"]
    assert s["ulimits"]["memlock"] == {"soft": -1, "hard": -1}  # type: ignore[index]
    assert "NCCL_IB_DISABLE" not in env(s)


def test_infiniband_off_disables_it_even_when_present() -> None:
    s = svc(settings(ib="off"), 1, CPU.model_copy(update={"infiniband": IB}), "10.0.0.5")
    assert "devices" not in s and "cap_add" not in s
    assert env(s)["NCCL_IB_DISABLE"] == "1"


def test_infiniband_on_requires_the_devices() -> None:
    with pytest.raises(UsageError, match="no /dev/infiniband"):
        svc(settings(ib="on"), 1, CPU, "10.0.0.5")
    assert "devices" in svc(settings(ib="on"), 1, CPU.model_copy(update={"infiniband": IB}), "10.0.0.5")


def test_interface_override_per_node() -> None:
    s = settings(nodes={1: NodeOverride(iface="ens5", addr="10.1.0.7")})
    e = env(svc(s, 1, CPU.model_copy(update={"iface": "eth0"}), "10.1.0.5"))
    assert e["GLOO_SOCKET_IFNAME"] == "ens5" and e["NCCL_SOCKET_IFNAME"] == "ens5"


def test_loopback_main_all_local_uses_lo() -> None:
    s = svc(settings(), 1, CPU)
    assert s["network_mode"] == "host"
    assert env(s)["MASTER_ADDR"] == "127.0.0.1" and env(s)["GLOO_SOCKET_IFNAME"] == "lo"


def test_loopback_main_contradicted_by_a_node_elsewhere() -> None:
    s = settings(nodes={1: NodeOverride(addr="10.0.0.6")})
    with pytest.raises(UsageError, match=r"\[nodes.1\] addr = 10.0.0.6"):
        svc(s, 0, CPU)


@pytest.mark.parametrize("override", [NodeOverride(iface="lo"), NodeOverride(addr="127.0.0.1")])
def test_loopback_node_with_a_remote_main(override: NodeOverride) -> None:
    with pytest.raises(UsageError, match="no other machine can reach it"):
        svc(settings(nodes={1: override}), 1, CPU, "10.0.0.5")


def test_bridge_refused_across_machines() -> None:
    with pytest.raises(UsageError, match="NAT") as e:
        svc(settings(network="bridge"), 1, CPU, "10.0.0.5")
    assert 'network = "bridge"' in (e.value.fix or "")


def test_bridge_needs_docker0() -> None:
    with pytest.raises(UsageError, match="docker0"):
        svc(settings(network="bridge"), 0, CPU.model_copy(update={"bridge_gateway": None}))


def test_bridge_all_local_publishes_the_rendezvous_ports_on_main_only() -> None:
    main, worker = svc(settings(network="bridge"), 0, CPU), svc(settings(network="bridge"), 1, CPU)
    assert main["network_mode"] == worker["network_mode"] == "bridge"
    assert main["ports"] == ["172.17.0.1:29500:29500/tcp", "172.17.0.1:29501:29501/tcp"]
    assert "ports" not in worker
    for s in (main, worker):
        assert env(s)["MASTER_ADDR"] == "172.17.0.1" and env(s)["GLOO_SOCKET_IFNAME"] == "eth0"


def test_bridge_golden() -> None:
    s = settings(network="bridge")
    launch = launch_spec(s)
    node = node_spec(s, launch, 0, "127.0.0.1", CPU)
    doc = render_compose(
        plan_container(node, CPU, image="nodekit/demo:0123456789ab", output_dir=Path("/srv/project/outputs"))
    )
    text = to_yaml(doc, rank=0, nnodes=2, path_hint="compose/node-0.yaml")
    path = GOLDEN / "node-0-bridge.yaml"
    update_golden(path, text)
    assert text == path.read_text()
    assert yaml.safe_load(text)["services"]["train"]["ipc"] == "host"


def test_debug_env_wins_over_configured_values() -> None:
    e = env(svc(settings(env={"NCCL_DEBUG": "WARN"}), 1, CPU, debug=True))
    assert (e["NCCL_DEBUG"], e["TORCH_DISTRIBUTED_DEBUG"], e["TORCH_CPP_LOG_LEVEL"]) == ("INFO", "DETAIL", "INFO")
    assert env(svc(settings(env={"NCCL_DEBUG": "WARN"}), 1, CPU))["NCCL_DEBUG"] == "WARN"


def _free_port_below(held: socket.socket) -> int:
    """A port P that nothing listens on, with ``held`` bound to P + 1. Other tests on this machine (xdist workers)
    take ephemeral ports too, so P is one the kernel gave out and gave back, not whatever port lies below ``held``'s."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            try:
                held.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no free port with a free port above it in 100 tries")


def test_up_refuses_a_taken_rendezvous_port_and_names_the_holder(tmp_path: Path) -> None:
    from nodekit.backends.compose.node import check_master_port
    from nodekit.errors import NetworkError
    from tests.factories import plan_here

    (tmp_path / "train.py").write_text("")
    with socket.socket() as held:
        port = _free_port_below(held)  # the preflight port (master + 1) is the one taken, the master port free
        held.listen()
        s = Settings(project_dir=tmp_path, name="demo", script="train.py", nnodes=2, master_port=port)
        plan = plan_here(s, 0, "127.0.0.1", image="x:y", facts=CPU)
        with pytest.raises(NetworkError, match=rf"port {port + 1} on main is already in use by .*pid {os.getpid()}"):
            check_master_port(plan)
        worker = plan_here(s, 1, "127.0.0.1", image="x:y", facts=CPU)
        check_master_port(worker)  # only main binds the rendezvous ports
