"""Same data on every node: after a good preflight, compare each checked mount's manifest across nodes.

Runs only when NODEKIT_DATA_CHECK names mounts (``[[mounts]] check = "sizes"`` or ``"hashes"``). Every node
publishes its manifests through the preflight store; node 0 compares each node's digest with its own and publishes
the report, which every node prints; a difference stops every node before training with exit 17, naming for
each differing node the first differing files, like the stack check's table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nodekit.launcher.datacheck.manifest import Entry, digest, first_differences, from_text, manifest, to_text
from nodekit.launcher.preflight.exchange import POLL_S, Store, _key

FIX = "make the data identical on every node (rsync from one copy), or fix [nodes.<rank>] mounts in nodekit.toml"


@dataclass(frozen=True)
class Published:
    """One node's view of one mount: its digest, file count and manifest text (or the error reading it)."""

    digest: str
    files: int
    text: str
    error: str = ""


def publish_own(
    store: Store, rank: int, checks: Sequence[tuple[str, str]], scan: Callable[..., tuple[Entry, ...]] = manifest
) -> None:
    for target, mode in checks:
        try:
            entries = scan(target, hashes=mode == "hashes")
            item = Published(digest(entries), len(entries), to_text(entries))
        except OSError as e:
            item = Published("", 0, "", f"cannot read {target}: {e.strerror or e}")
        store.set(_key("data", target, rank), json.dumps(item.__dict__))


def _read(store: Store, target: str, rank: int) -> Published:
    return Published(**json.loads(store.get(_key("data", target, rank))))


def compare_nodes(checks: Sequence[tuple[str, str]], views: dict[int, dict[str, Published]]) -> tuple[bool, str]:
    """(ok, report): every node's manifest of every checked mount against node 0's. Pure."""
    lines: list[str] = []
    bad = 0
    for target, mode in checks:
        main = views[0][target]
        what = "paths, sizes and contents" if mode == "hashes" else "paths and sizes"
        rows = [["node", "files", "digest", "first differences"]]
        differs = False
        for rank in sorted(views):
            view = views[rank][target]
            if view.error:
                note, differs = view.error, True
            elif view.digest != main.digest:
                diffs = first_differences(from_text(main.text), from_text(view.text))
                note, differs = "; ".join(diffs) or "differs", True
            else:
                note = "same as node 0" if rank else ""
            rows.append([str(rank), str(view.files), view.digest[:12] or "-", note])
        if differs:
            bad += 1
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            lines.append(f"  {target} ({what}):")
            lines += ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        else:
            lines.append(f"  {target}: same {what} on {len(views)} nodes ({main.files} files, {main.digest[:12]})")
    if bad:
        head = f"nodekit data check: DATA DIFFERS on {bad} mount(s): no node starts training (exit 17)"
        return False, "\n".join([head, *lines, f"  fix: {FIX}"])
    return True, "\n".join(["nodekit data check: ok", *lines])


def run(
    store: Store,
    rank: int,
    nnodes: int,
    checks: Sequence[tuple[str, str]],
    *,
    timeout_s: float,
    scan: Callable[..., tuple[Entry, ...]] = manifest,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> tuple[bool, str]:
    """Publish this node's manifests; node 0 compares and publishes the report; every node returns it."""
    publish_own(store, rank, checks, scan)
    if rank == 0:
        deadline = now() + timeout_s
        keys = [_key("data", t, r) for t, _ in checks for r in range(nnodes)]
        while not store.check(keys):
            if now() >= deadline:
                missing = sorted({r for t, _ in checks for r in range(nnodes) if not store.check([_key("data", t, r)])})
                text = f"nodekit data check: node(s) {', '.join(map(str, missing))} sent no manifest"
                store.set(_key("data-report"), json.dumps([False, text]))
                return False, text
            sleep(POLL_S)
        views = {r: {t: _read(store, t, r) for t, _ in checks} for r in range(nnodes)}
        ok, report = compare_nodes(checks, views)
        store.set(_key("data-report"), json.dumps([ok, report]))
        # Keep hosting until every node has read the report (the store may go away with this process next).
        seen_deadline = now() + 15.0
        while not store.check([_key("data-seen", r) for r in range(1, nnodes)]) and now() < seen_deadline:
            sleep(POLL_S)
        return ok, report
    got_ok, got_report = json.loads(store.get(_key("data-report")))
    store.set(_key("data-seen", rank), "1")
    return bool(got_ok), str(got_report)
