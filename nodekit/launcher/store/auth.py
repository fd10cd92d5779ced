"""Who may talk to main's preflight store: the handshake and the frame seals, as pure functions (no I/O).

Main's preflight port is reachable by anyone on the network, so the store (``kv.py``, ``server.py``) admits
only a process that holds the job secret, and main proves the same to every worker. Per connection:

1. client -> main  ``MAGIC | nc``                                  (36 bytes: a fresh 32-byte client nonce)
2. main -> client  ``MAGIC | ns | run | HMAC(secret, server|nc|ns|run)``   (84 bytes: fresh nonce, this run's id)
3. client -> main  ``HMAC(secret, client|nc|ns|run)``              (32 bytes)
4. every later message, both ways, is a frame ``len(4) | payload | HMAC(k, direction|seq|len|payload)`` with the
   session key ``k = HMAC(secret, session|nc|ns|run)``; main's first frame says the client is admitted.

Every message of the handshake has a fixed size, so main reads nothing it has not bounded, and nothing from a
client is parsed before its MAC is checked (constant-time). Both nonces are fresh per connection, so bytes recorded
from a good client (the handshake or any frame) verify on no other connection: a replay is refused. The run id
is chosen by main each time it starts hosting and is bound into every MAC and key: the store's namespace is that
one run's, and nothing from another run of the same job means anything in it. A worker checks main's MAC before
it sends anything that depends on the secret: a main without the job's secret (another job, or an impostor on the
port) is refused by the worker, which then says so (exit 17).

What this does not give: secrecy. The facts and manifests cross the network readable (they hold no secret); an
on-path attacker can read them or cut the connection, not change or inject anything. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

MAGIC = b"NKS1"  # nodekit store, protocol 1
NONCE_LEN = 32
RUN_ID_LEN = 16
TAG_LEN = 32
CLIENT_HELLO_LEN = len(MAGIC) + NONCE_LEN
SERVER_HELLO_LEN = len(MAGIC) + NONCE_LEN + RUN_ID_LEN + TAG_LEN
PROOF_LEN = TAG_LEN
HEADER_LEN = 4  # a frame's payload length, big-endian
TO_SERVER, TO_CLIENT = b"C", b"S"
_CONTEXT = b"nodekit-preflight-store/1|"


class NotNodekit(Exception):
    """The peer does not speak this protocol (another service on the port, or another nodekit version)."""


class WrongSecret(Exception):
    """Main's proof does not verify with this node's secret: main holds another job secret."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


@dataclass(frozen=True)
class Handshake:
    """The public values of one connection's handshake; with the secret they give both proofs and the session key."""

    client_nonce: bytes
    server_nonce: bytes
    run_id: bytes

    def _tag(self, secret: str, role: bytes) -> bytes:
        return _mac(secret.encode(), _CONTEXT, role, b"|", self.client_nonce, self.server_nonce, self.run_id)

    def server_tag(self, secret: str) -> bytes:
        return self._tag(secret, b"server")

    def client_tag(self, secret: str) -> bytes:
        return self._tag(secret, b"client")

    def session_key(self, secret: str) -> bytes:
        return self._tag(secret, b"session")


def client_hello(client_nonce: bytes) -> bytes:
    return MAGIC + client_nonce


def read_client_hello(data: bytes) -> bytes:
    """The client's nonce from its hello (exactly CLIENT_HELLO_LEN bytes); NotNodekit when it is not one."""
    if len(data) != CLIENT_HELLO_LEN or not data.startswith(MAGIC):
        raise NotNodekit("not a nodekit store hello")
    return data[len(MAGIC) :]


def server_hello(secret: str, hs: Handshake) -> bytes:
    return MAGIC + hs.server_nonce + hs.run_id + hs.server_tag(secret)


def read_server_hello(data: bytes, secret: str, client_nonce: bytes) -> Handshake:
    """Check main's hello against our nonce and secret: the handshake, or NotNodekit / WrongSecret."""
    if len(data) != SERVER_HELLO_LEN or not data.startswith(MAGIC):
        raise NotNodekit("main's answer is not a nodekit store hello")
    at = len(MAGIC)
    ns, run = data[at : at + NONCE_LEN], data[at + NONCE_LEN : at + NONCE_LEN + RUN_ID_LEN]
    hs = Handshake(client_nonce, ns, run)
    if not hmac.compare_digest(hs.server_tag(secret), data[-TAG_LEN:]):
        raise WrongSecret("main's proof does not verify with this node's job secret")
    return hs


NOTICE = b"NKW1"  # in place of the proof: "this node holds another secret", sent by a worker that refuses main


def wrong_secret_notice(rank: int) -> bytes:
    """What a worker whose secret does not verify main's proof sends in place of its own proof (PROOF_LEN bytes):
    its node rank, so that main can name it at once instead of at ``rdzv_timeout``. Unauthenticated by nature (the
    two hold no common key): main only prints it, and it changes nothing main decides."""
    return (NOTICE + rank.to_bytes(4, "big")).ljust(PROOF_LEN, b"\0")


def notice_rank(unit: bytes) -> int | None:
    """The rank a :func:`wrong_secret_notice` names, or None when ``unit`` is not one."""
    if len(unit) != PROOF_LEN or not unit.startswith(NOTICE) or any(unit[len(NOTICE) + 4 :]):
        return None
    return int.from_bytes(unit[len(NOTICE) : len(NOTICE) + 4], "big")


def proof_ok(secret: str, hs: Handshake, proof: bytes) -> bool:
    """Main: is ``proof`` (exactly PROOF_LEN bytes) the client's MAC for this handshake? Constant time."""
    return len(proof) == PROOF_LEN and hmac.compare_digest(hs.client_tag(secret), proof)


def frame_mac(key: bytes, direction: bytes, seq: int, header: bytes) -> hmac.HMAC:
    """A frame's MAC before its payload: ``update`` it with the payload in pieces, then :func:`tag_ok`. Main
    checks a frame it will not keep this way, without holding its payload."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(direction + seq.to_bytes(8, "big") + header)
    return mac


def tag_ok(mac: hmac.HMAC, tag: bytes) -> bool:
    return hmac.compare_digest(mac.digest(), tag)


def _frame_tag(key: bytes, direction: bytes, seq: int, header: bytes, payload: bytes) -> bytes:
    mac = frame_mac(key, direction, seq, header)
    mac.update(payload)
    return mac.digest()


def seal(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    """One frame: header, payload, tag. ``seq`` counts the frames sent in this direction on this connection."""
    header = len(payload).to_bytes(HEADER_LEN, "big")
    return header + payload + _frame_tag(key, direction, seq, header, payload)


def frame_length(header: bytes) -> int:
    return int.from_bytes(header, "big")


def unseal(key: bytes, direction: bytes, seq: int, header: bytes, body: bytes) -> bytes | None:
    """The payload of a frame whose ``body`` is payload and tag, or None when the tag does not verify (a forged,
    replayed, reordered or reflected frame)."""
    if len(body) < TAG_LEN:
        return None
    payload, tag = body[:-TAG_LEN], body[-TAG_LEN:]
    if len(payload) != frame_length(header):
        return None
    if not hmac.compare_digest(_frame_tag(key, direction, seq, header, payload), tag):
        return None
    return payload
