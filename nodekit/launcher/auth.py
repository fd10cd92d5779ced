"""The job's store is the job's: every key the protocol uses lives under a namespace derived from the job secret.

Anyone who can reach main's preflight/heartbeat port can talk to its TCPStore (it has no authentication of its
own). Preflight and the peer watchdog therefore use :class:`ScopedStore`, whose keys are prefixed with
``HMAC-SHA256(secret, "nodekit-store")``: a process without the secret cannot name them (TCPStore cannot list
keys), so it can neither join the preflight (main never reads its facts) nor write a watchdog "done" that
would stop training. The secret itself never crosses the network.

So that a node whose secret differs (a copied compose file from another job, a stale ``.nodekit/job-secret``)
learns it at once instead of waiting out the timeout, main publishes a challenge in the clear: a random nonce
and ``HMAC(secret, nonce)``. A worker checks it with its own secret before publishing anything.

Limits: TCPStore traffic is plain TCP, so a host on the path between nodes can read the namespace and then
write keys; this keeps out other processes and other jobs, not an on-path attacker (use a private network).
Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

from nodekit.launcher.preflight import POLL_S, Clock, PreflightError, Store

AUTH_KEY = "nodekit/auth"


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def namespace(secret: str) -> str:
    """The key prefix for one job: unguessable without the secret; the same on every node that has it."""
    return f"job-{_mac(secret, 'nodekit-store')[:32]}/"


class ScopedStore:
    """A store whose keys all live under the job's namespace (set/get/add/check, as the protocol uses)."""

    def __init__(self, store: Store, secret: str) -> None:
        self.inner = store
        self.prefix = namespace(secret)

    def set(self, key: str, value: str) -> None:
        self.inner.set(self.prefix + key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(self.prefix + key)

    def add(self, key: str, amount: int) -> int:
        return int(self.inner.add(self.prefix + key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check([self.prefix + k for k in keys]))


class SecretMismatch(PreflightError):
    """This node's job secret is not main's: it belongs to another job (or to a stale copy of this one)."""


def announce(store: Store, secret: str) -> None:
    """Main, right after hosting the store: publish the challenge workers check their secret against."""
    nonce = secrets.token_hex(16)
    store.set(AUTH_KEY, json.dumps({"nonce": nonce, "mac": _mac(secret, nonce)}))


def verify(store: Store, secret: str, deadline: float, clock: Clock, target: str) -> None:
    """A worker, before publishing: wait for main's challenge and check it with our secret.

    Raises :class:`SecretMismatch` (one line) when main holds another secret, PreflightError when no challenge
    comes before ``deadline`` (main is not a nodekit launcher of this version).
    """
    while not store.check([AUTH_KEY]):
        if clock.now() >= deadline:
            raise PreflightError(f"main {target} never published its job challenge (is it nodekit's launcher?)")
        clock.sleep(POLL_S)
    try:
        data = json.loads(store.get(AUTH_KEY))
        ok = hmac.compare_digest(_mac(secret, str(data["nonce"])), str(data["mac"]))
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise SecretMismatch(
            f"main {target} runs a job with another NODEKIT_JOB_SECRET than this node's; this node does not join. "
            "Every node needs the same secret: the same exported NODEKIT_JOB_SECRET, or the same "
            ".nodekit/job-secret copied with the project"
        )
