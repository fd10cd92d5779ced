"""What one rank's container is, decided from the job and the host it runs on, whatever backend starts it."""

from __future__ import annotations

from typing import Any

from nodekit.system.host.facts import HostFacts

# NVIDIA's recommendation for deep-learning containers (nvidia-docker's --ulimit stack=67108864).
STACK_BYTES = 64 * 1024 * 1024


def ulimits(facts: HostFacts) -> dict[str, Any]:
    """The ulimits a node's container asks for on a host with ``facts`` (compose's ``ulimits`` key)."""
    stack = STACK_BYTES if facts.stack_hard is None else min(STACK_BYTES, facts.stack_hard)
    limits: dict[str, Any] = {"stack": {"soft": stack, "hard": stack}}
    # runc refuses to start a container whose limit exceeds what the daemon may raise to (seen with an 8 MiB
    # hard memlock): ask for unlimited memlock only where the host allows it.
    if facts.memlock_hard is None:
        limits["memlock"] = {"soft": -1, "hard": -1}
    return limits
