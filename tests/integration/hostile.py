"""A client without the job secret, run in a container of the job's own image (python + torch) on the host's
network by tests/integration/test_preflight_port.py. Runs until SIGTERM (``docker stop``), then prints one JSON line.

    hammer PORT    overwrite and flood main's preflight store as a TCPStore client (what the old store accepted)
                   and with raw connections: garbage, 4 GiB length prefixes, made-up proofs, unfinished handshakes
    capture PORT   record what clients send to PORT on the loopback interface (AF_PACKET; needs CAP_NET_RAW)
    replay PORT F  send the first stream of capture file F to PORT again and again, as a new connection each time

Standard library, plus torch for the TCPStore client (absent torch, that part counts as refused).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType

MAGIC = b"NKS1"  # nodekit's store hello, as an attacker reading the source would know
stopping = threading.Event()
counts = {"tcpstore_writes": 0, "tcpstore_refused": 0, "raw_connections": 0, "replays": 0}


def _stop(signum: int, frame: FrameType | None) -> None:
    stopping.set()


def tcpstore_attack(port: int) -> None:
    """What would break every honest node, were it let in: the challenge overwritten again and again, the verdict
    forged, main's memory filled. Prints "tcpstore in" when a TCPStore connection was accepted."""
    from datetime import timedelta

    try:
        from torch.distributed import TCPStore
    except ImportError:
        return
    while not stopping.is_set():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            stopping.wait(0.02)  # main's port not up yet
            continue
        try:
            store = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=3), wait_for_workers=False)
            store.set("nodekit/verdict", json.dumps({"status": "mismatch"}))
            for i in range(4):
                store.set(f"junk/{i}", "x" * (8 << 20))
            counts["tcpstore_writes"] += 5
            print("tcpstore in", flush=True)
            while not stopping.is_set():
                store.set("nodekit/auth", json.dumps({"nonce": "0", "mac": "forged"}))
                counts["tcpstore_writes"] += 1
                stopping.wait(0.02)
        except Exception:
            counts["tcpstore_refused"] += 1
            stopping.wait(0.2)


def raw_attack(port: int) -> None:
    held: list[socket.socket] = []
    kinds = ("garbage", "length", "partial", "guess", "silent", "close")
    i = 0
    while not stopping.is_set():
        kind = kinds[i % len(kinds)]
        i += 1
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            stopping.wait(0.05)
            continue
        counts["raw_connections"] += 1
        try:
            if kind == "garbage":
                sock.sendall(os.urandom(64 << 10))
            elif kind == "length":
                sock.sendall(b"\xff\xff\xff\xff" * 16)
            elif kind == "partial":
                sock.sendall(MAGIC + b"\x00" * 10)
            elif kind == "guess":
                sock.sendall(MAGIC + os.urandom(32))
                sock.recv(84)
                sock.sendall(os.urandom(32) + b"\x00\x00\x00\x10" + os.urandom(48))
        except OSError:
            pass
        held.append(sock)
        if len(held) > 200:
            held.pop(0).close()
        time.sleep(0.003)  # a few hundred connections a second: a flood, without starving 2 cores' training


def capture(port: int) -> dict[str, object]:
    """Client-to-port payloads per source port, reassembled by sequence number, longest first (base64)."""
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.2)
    print("ready", flush=True)
    streams: dict[int, dict[int, bytes]] = {}
    while not stopping.is_set():
        try:
            frame, addr = sniffer.recvfrom(1 << 17)
        except (TimeoutError, InterruptedError):
            continue
        if addr[2] == socket.PACKET_OUTGOING or frame[12:14] != b"\x08\x00":
            continue  # lo shows each packet twice; IPv4 only (MASTER_ADDR 127.0.0.1)
        ip = frame[14:]
        ihl, total = (ip[0] & 0x0F) * 4, int.from_bytes(ip[2:4], "big")
        if ip[9] != 6:
            continue
        tcp = ip[ihl:total]
        if int.from_bytes(tcp[2:4], "big") != port:
            continue
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            streams.setdefault(int.from_bytes(tcp[0:2], "big"), {})[int.from_bytes(tcp[4:8], "big")] = payload
    joined = []
    for segments in streams.values():
        first = min(segments)
        joined.append(b"".join(segments[s] for s in sorted(segments, key=lambda s: (s - first) % 2**32)))
    joined.sort(key=len, reverse=True)
    return {"streams": [base64.b64encode(s).decode() for s in joined]}


def replay(port: int, stream: bytes) -> None:
    while not stopping.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(stream)
                counts["replays"] += 1
                print(f"replayed {counts['replays']}", flush=True)
                sock.settimeout(1.0)
                while sock.recv(1 << 16):
                    pass
        except OSError:
            pass
        stopping.wait(0.1)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "capture":
        print(json.dumps(capture(port)), flush=True)
        return
    if mode == "hammer":
        workers = [threading.Thread(target=tcpstore_attack, args=(port,), daemon=True)]
        workers += [threading.Thread(target=raw_attack, args=(port,), daemon=True) for _ in range(2)]
    else:
        with open(sys.argv[3]) as f:
            stream = base64.b64decode(json.load(f)["streams"][0])
        workers = [threading.Thread(target=replay, args=(port, stream), daemon=True)]
    for w in workers:
        w.start()
    while not stopping.wait(0.5):
        print(f"progress {json.dumps(counts)}", flush=True)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
