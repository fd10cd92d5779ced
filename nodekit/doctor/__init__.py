"""``nodekit doctor``: the troubleshooting guides' list of multi-node traps, as checks.

Split by responsibility; this package re-exports the public names, so ``from nodekit.doctor import ...`` and
``nodekit.doctor.gather`` / ``.rows`` / ``.serve`` keep working:

- :mod:`~nodekit.doctor.model`: the data, :class:`DoctorFacts` in and :class:`CheckRow` out.
- :mod:`~nodekit.doctor.checks` and :mod:`~nodekit.doctor.network`: pure. :func:`rows` turns facts into PASS / WARN /
  FAIL / SKIP rows, each WARN and FAIL with the exact command that fixes it; tests feed it facts.
- :mod:`~nodekit.doctor.gathering`: :func:`gather`, the only part that runs commands, opens sockets or talks to
  Docker, and keeps the whole run under ten seconds by doing the slow parts side by side with bounded waits.
- :mod:`~nodekit.doctor.handshake`: the doctor-to-doctor TCP round trip: its protocol, the worker's client
  (:func:`~nodekit.doctor.handshake.probe`) and main's listener.
- :mod:`~nodekit.doctor.listen`: :func:`serve`, main's listening half of the TCP round trip, run only on request
  (``--listen``).
"""

from __future__ import annotations

from nodekit.doctor.checks import DAEMON_LIMIT_FIX, GIB, MIB, NOFILE_WANTED, SHM_WANTED, STACK_WANTED, TOOLKIT_FIX, rows
from nodekit.doctor.gathering import CONTAINER_SCRIPT, CONTAINER_WAIT_S, gather, parse_container_probe
from nodekit.doctor.listen import serve
from nodekit.doctor.model import (
    CheckRow,
    ContainerCheck,
    ContainerView,
    DoctorFacts,
    EngineCheck,
    ImageCheck,
    Status,
    as_json,
    exit_code,
)
from nodekit.doctor.network import CLOCK_TOLERANCE_S, NCCL_RANGE, arrivals_row

__all__ = [
    "CLOCK_TOLERANCE_S",
    "CONTAINER_SCRIPT",
    "CONTAINER_WAIT_S",
    "DAEMON_LIMIT_FIX",
    "GIB",
    "MIB",
    "NCCL_RANGE",
    "NOFILE_WANTED",
    "SHM_WANTED",
    "STACK_WANTED",
    "TOOLKIT_FIX",
    "CheckRow",
    "ContainerCheck",
    "ContainerView",
    "DoctorFacts",
    "EngineCheck",
    "ImageCheck",
    "Status",
    "arrivals_row",
    "as_json",
    "exit_code",
    "gather",
    "parse_container_probe",
    "rows",
    "serve",
]
