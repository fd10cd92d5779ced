"""Main's listening half of the doctor's TCP round trip, run only on request (``nodekit doctor --listen``).

:func:`serve` answers the workers' doctors on both rendezvous ports (through
:func:`nodekit.doctor.handshake.listen`) until every worker came on every port or time is up, and returns one row:
:func:`nodekit.doctor.network.arrivals_row`'s verdict, or a FAIL when the ports cannot be bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from nodekit.config.settings import Settings
from nodekit.doctor import handshake
from nodekit.doctor.handshake import Arrival
from nodekit.doctor.model import CheckRow, Status
from nodekit.doctor.network import arrivals_row
from nodekit.launcher.contract import preflight_port_for
from nodekit.system.host import net


def serve(
    settings: Settings,
    *,
    main_ip: str | None,
    seconds: float,
    host: str = "0.0.0.0",
    on_ready: Callable[[], None] | None = None,
    on_arrival: Callable[[Arrival], None] | None = None,
) -> CheckRow:
    """Main's half of the round trip: listen on both rendezvous ports until every worker came or time is up."""
    ports = [settings.master_port, preflight_port_for(settings.master_port)]
    route = net.route_to(main_ip) if main_ip else None
    mtu = net.mtu(route.iface) if route else None
    expected = range(1, settings.nnodes)

    def everyone(arrivals: list[Arrival]) -> bool:
        return bool(expected) and all(_came(arrivals, r, p) for r in expected for p in ports)

    started = time.monotonic()
    try:
        arrivals = handshake.listen(
            ports,
            seconds=seconds,
            host=host,
            about={"mtu": str(mtu)} if mtu else {},
            until=everyone,
            on_ready=on_ready,
            on_arrival=on_arrival,
        )
    except OSError as e:
        return CheckRow("workers", Status.FAIL, f"cannot listen on {ports}: {e.strerror}", "see the ports on main row")
    return arrivals_row(
        arrivals, nnodes=settings.nnodes, ports=ports, seconds=time.monotonic() - started, main_ip=main_ip
    )


def _came(arrivals: Sequence[Arrival], rank: int, port: int) -> bool:
    return any(a.rank == rank and a.port == port for a in arrivals)
