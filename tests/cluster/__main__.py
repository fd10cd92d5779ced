"""A virtual cluster by hand (root):

    python -m tests.cluster up 3        # 3 hosts; prints each host's address and DOCKER_HOST
    python -m tests.cluster status
    python -m tests.cluster down [--purge]   # --purge also deletes the hosts' image stores

Then, for example, on host 1:

    nsenter --net=/var/run/netns/nkc-h1 env DOCKER_HOST=unix:///run/nodekit-cluster/nkc/h1/docker.sock \\
        nodekit up --node-rank 1 --main 172.31.250.10

See tests/cluster/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.cluster.harness import Cluster, HarnessError, clean, leftovers, ping_socket, read_state


def _print_hosts(c: dict[str, object]) -> None:
    hosts = c.get("hosts")
    assert isinstance(hosts, list)
    for h in hosts:
        sock = str(h["DOCKER_HOST"]).removeprefix("unix://")
        state = "up" if ping_socket(Path(sock)) else "DOWN"
        print(f"{h['name']}  {h['addr']:<15} {state:<5} netns {h['netns']:<10} DOCKER_HOST={h['DOCKER_HOST']}")
    if hosts:
        first, main = hosts[min(1, len(hosts) - 1)], hosts[0]
        print(
            f"\ntry: nsenter --net=/var/run/netns/{first['netns']} env DOCKER_HOST={first['DOCKER_HOST']} "
            f"nodekit up --node-rank {first['name'][1:]} --main {main['addr']}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cluster", description="A virtual cluster on this machine.")
    p.add_argument("--name", default="nkc", help="cluster name, prefix of its namespaces (default nkc)")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create N hosts, each with its own address and dockerd")
    up.add_argument("n", type=int, nargs="?", default=3)
    up.add_argument("--no-decoy", action="store_true", help="no decoy interface holding the default route")
    up.add_argument("--subnet", default="172.31.250.0/24")
    down = sub.add_parser("down", help="kill the hosts' processes and remove the namespaces")
    down.add_argument("--purge", action="store_true", help="also delete the hosts' data roots (images)")
    st = sub.add_parser("status", help="print the hosts")
    st.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    try:
        if args.cmd == "up":
            c = Cluster(args.n, name=args.name, subnet=args.subnet, decoy=not args.no_decoy).up()
            print(f"cluster {c.name}: {c.n} hosts up in {c.timings['up_s']:.1f} s")
            _print_hosts(c.describe())
        elif args.cmd == "down":
            state = read_state(Cluster(1, name=args.name).state_file)
            clean(args.name, purge=args.purge)
            print(f"cluster {args.name} is down" if state or args.purge else f"no cluster {args.name} was up")
        else:
            state = read_state(Cluster(1, name=args.name).state_file)
            if state is None:
                print(f"no cluster {args.name} (leftover namespaces: {', '.join(leftovers(args.name)) or 'none'})")
                return 1
            if args.json:
                print(json.dumps(state, indent=2))
            else:
                _print_hosts(state)
    except HarnessError as e:
        print(f"cluster: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
