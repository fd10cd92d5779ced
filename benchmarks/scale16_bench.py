"""`make bench` (part): issue 48 item 4, measured on up to 16 real virtual hosts (tests/cluster: one network namespace,
dockerd and sshd per host) in one run:

- ``nodekit run`` from the command to rank 0's first step at 2, 4, 8 and 16 hosts against bare torchrun started over
  SSH on the same hosts (the anchor of docs/fleet-bench.md: same image, same script, each host's gloo interface
  named by hand), in interleaved pairs, decided on the 95% bootstrap interval of the difference of the medians
  (target: within +2.0 s at 8 and 16 hosts);
- the head's footprint in those runs (benchmarks/_headprobe.py: its CPU seconds, with its children and its
  connections' masters; peak resident memory, open files and processes of that whole tree);
- at the largest count, the link check's and the peer watchdog's cost: the same run with ``[health] links = "off"``
  and ``peer_timeout = 0`` ("lean") interleaved with the other two sides, and the check's own headline;
- the bytes on the head's link for a whole image to 16 hosts (all but the head), relay chains of eight against the
  relay tree, in the same run (benchmarks/tree_bench.py's pushes; target: the tree at most 1.2 copies).

The job is examples/ddp, one epoch, gloo, one process per host: 16 hosts' dockerds, launchers and workers share this
machine's memory and cores. The cluster has one host more than the largest count: the head (h0, rank 0 of every
run) and the targets of the shipping comparison (h1 onwards). Results accumulate in ``--state`` (JSON; a host count
run again replaces its entry), and the doc's section is printed (docs/scale.md takes it by hand).

Not a test. Needs root, a dockerd and Debian's openssh-server (make engine sshd), and the heavy lock:

    flock /tmp/nodekit-heavy.lock .venv/bin/python benchmarks/scale16_bench.py [--hosts 2,4,8,16] [--pairs 3]
        [--warmup 1] [--mib 64] [--no-ship] [--state F]
    .venv/bin/python benchmarks/scale16_bench.py --render F     # the section again, from a state file
"""

from __future__ import annotations

import argparse
import compileall
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import fleet_phases, stats  # noqa: E402
from benchmarks._project import loadavg, now_utc, read_state, write_state  # noqa: E402

TARGET_S = 2.0
COPIES_TARGET = 1.2
LEAN = 'peer_timeout = 0\n[health]\nlinks = "off"'
"""The run without the link check and the peer watchdog: what they cost is the difference."""


def median_of(runs: Sequence[Mapping[str, Any]], key: str) -> float:
    xs = [r[key] for r in runs if key in r]
    return stats.median(xs) if xs else float("nan")


def foot(runs: Sequence[Mapping[str, Any]], key: str) -> float:
    xs = [r["footprint"][key] for r in runs if "footprint" in r]
    return stats.median(xs) if xs else float("nan")


def ship_phase(c: Any, mib: int) -> dict[str, Any]:
    """One copy to one target, then the chains, then the tree, each to targets without the image (a fresh image of
    ``mib`` MiB of random bytes in the head's engine, removed from the targets before each side): seconds and the
    head's link bytes per side."""
    from benchmarks.tree_bench import CHAIN_MAX, pushes
    from tests.cluster.helpers import make_image

    ref = "nodekit/scale16:ship"
    make_image(c.head, ref, seed=random.randrange(1 << 30), mib=mib)  # one layer of its own: no host holds any of it
    urls = [f"ssh://root@{t.addr}" for t in c.targets]
    c.remove(c.targets, [ref])
    _, copy = pushes(c, ref, c.head.docker_host, [urls[:1]], None)
    got: dict[str, Any] = {"hosts": len(urls), "mib": mib, "one_copy_bytes": copy, "measured": now_utc()}
    for side, groups, fanout in (
        ("chains", [urls[i : i + CHAIN_MAX] for i in range(0, len(urls), CHAIN_MAX)], 1),
        ("tree", [urls], None),
    ):
        c.remove(c.targets, [ref])
        seconds, sent = pushes(c, ref, c.head.docker_host, groups, fanout)
        got[side] = {"seconds": seconds, "bytes": sent, "copies": round(sent / copy, 2)}
        print(f"scale16: {side}: {len(urls)} hosts in {seconds:.1f} s, {sent / 2**20:.1f} MiB on the head's link "
              f"= {sent / copy:.2f} copies", flush=True)  # fmt: skip
    c.remove(c.targets, [ref])
    return got


def fleet_phase(c: Any, n: int, ref: str, project: Path, base: str, env: dict[str, str], work: Path, *, pairs: int,
                warmup: int, lean: bool, save: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """``pairs`` interleaved rounds at ``n`` hosts (h0 onwards), each a nodekit run and a bare torchrun (and, with
    ``lean``, a nodekit run without the link check and the watchdog), the order rotating; ``warmup`` rounds first,
    not counted. The results so far go to ``save`` after each counted round (a cut-off run keeps its rounds)."""
    from benchmarks.fleet_bench import bare_run, configure, kit_run

    hosts = [f"ssh://root@{h.addr}" for h in c.cluster.hosts[:n]]
    cfg = project / "nodekit.toml"
    sides = ["kit", "bare", *(["lean"] if lean else [])]
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    t_n, load0 = time.monotonic(), loadavg()

    def one(side: str, i: int) -> dict[str, Any]:
        port = 29700 + 2 * ((i * 3 + sides.index(side)) % 30)  # nodekit's preflight store is on port + 1
        if side == "bare":
            return bare_run(c.cluster, n, ref, project, port, c.bin_dir, env, work / f"bare-{n}")
        configure(cfg, base, hosts, LEAN if side == "lean" else "")
        return kit_run(c.cluster, n, ref, project, port, env, work / f"{side}-{n}-{i}.log")

    for i in range(-warmup, pairs):
        order = sides[i % len(sides) :] + sides[: i % len(sides)]
        done = {s: one(s, i) for s in order}
        if i < 0:
            continue
        for s in sides:
            got[s].append(done[s])
        print(f"scale16: {n} host(s), round {i + 1}: " + ", ".join(
            f"{s} {done[s]['first']:.2f} s ({done[s]['cpu']:.1f} CPU s)" for s in sides), flush=True)  # fmt: skip
        save({**got, "measured": now_utc(), "load_start": load0, "load_end": loadavg(),
              "minutes": (time.monotonic() - t_n) / 60, "warmup": warmup})  # fmt: skip


def distribute(c: Any, ref: str, n: int) -> float:
    """The run's image on hosts h0 to h(n-1) (from this machine's engine to h0, then from h0's engine to the others
    that lack it, through their engines' sockets: not timed as part of any run); seconds it took."""
    from tests.cluster.helpers import push_image

    t0 = time.monotonic()
    push_image(ref, None, [c.head])
    push_image(ref, c.head.docker_host, list(c.cluster.hosts[1:n]))
    return time.monotonic() - t0


def render(state: Mapping[str, Any], *, seed: int = 1) -> str:
    """docs/scale.md's section from the accumulated results (pure)."""
    fleet = state.get("fleet", {})
    rows, heads, phases, notes = [], [], [], []
    for key in sorted(fleet, key=int):
        r = fleet[key]
        rows.append(fleet_phases.first_step_row(key, r, TARGET_S, seed=seed))
        ks = r["kit"]
        links = next((x["links"] for x in ks if x.get("links")), "not in the log")
        heads.append(f"| {key} | {foot(ks, 'cpu_s'):.1f} ({foot(ks, 'cpu_s') / int(key):.2f}) | "
                     f"{foot(ks, 'rss_mb'):.0f} MB | {foot(ks, 'fds'):.0f} ({foot(ks, 'head_fds'):.0f}) | "
                     f"{foot(ks, 'procs'):.0f} | {links} |")  # fmt: skip
        phases.append(fleet_phases.breakdown_row(int(key), r["kit"], r["bare"]))
        if any("footprint" in x for x in r["bare"]):  # probed as nodekit's side is, since issue 48's fourth stop
            b = r["bare"]
            notes.append(f"{key} hosts, bare torchrun's head (its {key} `ssh` clients, probed as nodekit's head is): "
                         f"{foot(b, 'cpu_s'):.1f} CPU s for the whole run, peak {foot(b, 'rss_mb'):.0f} MB "
                         f"resident, {foot(b, 'fds'):.0f} open files")  # fmt: skip
        if all("findings" in x for x in ks):  # recorded since issue 48's fifth stop
            named = "; ".join(", ".join(f"{n} {kind}" for kind, n in sorted(x["findings"].items())) or "none"
                              for x in ks)  # fmt: skip
            notes.append(f"{key} hosts, the pairs the link check named in each nodekit run (every link alike): "
                         f"{named}")  # fmt: skip
        notes.append(f"{key} hosts: {len(ks)} pairs after {r['warmup']} round(s) not counted, {r['measured']}, "
                     f"load {r['load_start']} at the start and {r['load_end']} at the end, {r['minutes']:.1f} "
                     f"minutes")  # fmt: skip
        if r.get("lean"):
            lean = r["lean"]
            each = ", ".join(f"{x['first']:.1f}" for x in lean)
            notes.append(f"{key} hosts, without the link check and the peer watchdog (`links = \"off\"`, "
                         f"`peer_timeout = 0`), {len(lean)} runs interleaved: first step "
                         f"{median_of(lean, 'first'):.2f} s ({each}) against "
                         f"{median_of(ks, 'first'):.2f} s with them; machine CPU to the first step "
                         f"{median_of(lean, 'cpu'):.1f} against {median_of(ks, 'cpu'):.1f} CPU s; the head "
                         f"{foot(lean, 'cpu_s'):.1f} against {foot(ks, 'cpu_s'):.1f} CPU s")  # fmt: skip
    mbit = state.get("mbit", 0)
    links = (f"every host's link limited to {mbit} Mbit/s (tc tbf on both ends of every veth)" if mbit else
             "the links unshaped (a transfer is a copy on the shared cores)")  # fmt: skip
    out = [f"Measured by `benchmarks/scale16_bench.py` on the virtual cluster ({os.cpu_count()} cores shared by "
           f"every host, the head and every container; {links}): examples/ddp, one epoch, gloo, one process per "
           "host; the image already on every host; bare torchrun started over SSH on the same hosts as the anchor "
           "(docs/fleet-bench.md).", ""]  # fmt: skip
    out += [f"- {n}" for n in notes]
    if ship := state.get("ship"):
        ch, tr = ship["chains"], ship["tree"]
        verdict = "met" if tr["copies"] <= COPIES_TARGET else "not met"
        out += ["", f"The head's link, a whole image of {ship['mib']} MiB (random bytes) from the head to "
                f"{ship['hosts']} hosts without it ({ship['measured']}; one copy to one host: "
                f"{ship['one_copy_bytes'] / 2**20:.1f} MiB on the link): relay chains of eight "
                f"{ch['bytes'] / 2**20:.1f} MiB = **{ch['copies']:.2f} copies** in {ch['seconds']:.1f} s; the relay "
                f"tree {tr['bytes'] / 2**20:.1f} MiB = **{tr['copies']:.2f} copies** in {tr['seconds']:.1f} s "
                f"(target at most {COPIES_TARGET} copies: {verdict})."]  # fmt: skip
    out += ["", f"Target (issue 48): nodekit within +{TARGET_S:g} s of bare torchrun at 8 and 16 hosts, decided on "
            "the 95% bootstrap interval of the difference of the medians.", "",
            "| hosts | bare torchrun: first step, median (runs) | nodekit run: first step, median (runs) | difference "
            "[95% interval] | verdict | machine CPU s to the first step, bare / nodekit (median) |",
            "| --- | --- | --- | --- | --- | --- |", *rows, "",
            "The head in the same nodekit runs (median; `nodekit run`, its children and its connections' masters):",
            "", "| hosts | CPU s for the whole run (per host) | peak resident | peak open files (its own process) | "
            "peak processes | the link check's headline |", "| --- | --- | --- | --- | --- | --- |", *heads, "",
            "Where the seconds go (median second since the command; earliest to latest node):", "",
            fleet_phases.BREAKDOWN_HEADER, *phases, ""]  # fmt: skip
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,4,8,16", help="host counts, run in this order (default 2,4,8,16)")
    parser.add_argument("--pairs", type=int, default=3, help="counted rounds per host count (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds first, not counted (default 1)")
    parser.add_argument("--mib", type=int, default=64, help="the shipping comparison's image (default 64 MiB)")
    parser.add_argument("--no-ship", action="store_true", help="skip the shipping comparison")
    parser.add_argument("--no-lean", action="store_true", help="no run without the link check and the watchdog")
    parser.add_argument(
        "--mbit",
        type=int,
        default=0,
        help="every host's link limited to this rate, both ends of every veth (tc tbf), as a host's "
        "own NIC limits it; 0 (default): unshaped, every transfer a copy on the shared cores",
    )
    parser.add_argument("--state", type=Path, default=Path("/tmp/nodekit-scale16.json"))
    parser.add_argument("--render", type=Path, help="print the section from this state file, run nothing")
    opts = parser.parse_args()
    if opts.render:
        print(render(read_state(opts.render)))
        return 0
    from benchmarks._project import build, copy_demo, exit_on_signals
    from benchmarks._shipcluster import ShipCluster

    exit_on_signals()
    compileall.compile_dir(ROOT / "nodekit", quiet=1)  # the head runs nodekit as `pip install` leaves it
    counts = [int(x) for x in opts.hosts.split(",")]  # in this order: the counts that matter most can go first
    state: dict[str, Any] = read_state(opts.state)
    if state.get("fleet") and state.get("mbit", 0) != opts.mbit:
        raise SystemExit(f"{opts.state} holds runs at --mbit {state.get('mbit', 0)}: pass another --state")
    state["mbit"] = opts.mbit
    fleet: dict[str, Any] = state.setdefault("fleet", {})
    project = copy_demo("nodekit-scale16-")
    work = project.parent
    ref = build(project, quiet=True)
    base = (project / "nodekit.toml").read_text()
    try:
        with ShipCluster("nk16", max(counts), "classic", work) as c:
            env = {"PATH": f"{c.bin_dir}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": "",
                   "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}  # fmt: skip
            if opts.mbit:
                c.shape(opts.mbit)
            for n in counts:
                took = distribute(c, ref, n)
                print(f"scale16: the image on {n} host(s) ({took:.0f} s)", flush=True)

                def save(got: dict[str, Any], key: str = str(n)) -> None:
                    fleet[key] = got
                    write_state(opts.state, state)

                fleet_phase(c, n, ref, project, base, env, work, pairs=opts.pairs, warmup=opts.warmup,
                            lean=n == max(counts) and not opts.no_lean, save=save)  # fmt: skip
            # Last: today's relay tree was measured by benchmarks/tree_bench.py too, so a run cut short loses the
            # runs that only this benchmark makes first.
            if not opts.no_ship:
                state["ship"] = ship_phase(c, opts.mib)
                write_state(opts.state, state)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
