"""A dataset declared with ``source`` reaches three hosts over real SSH (Debian's sshd in every host, the hosts'
own python3 running the receiver), and stays identical to the source: a push that changes nothing carries no
payload, a one-file change carries that file, a damaged copy on one host is repaired by the next push.

The virtual hosts share one file system, so each host's copy is kept on its own path (``[nodes.R] mounts``), as it
would be on its own disk; each path's manifest is compared with the source's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.cluster.helpers import Fleet, head_tx, nodekit_argv

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

SMALL = 300
BIG_MIB = 8


def _project(fleet: Fleet, base: Path) -> tuple[Path, Path, list[Path]]:
    project, data = base / "project", base / "project" / "data"
    paths = [base / f"on-{h.name}" for h in fleet.cluster.hosts]
    (data / "shards").mkdir(parents=True)
    for i in range(SMALL):
        (data / "shards" / f"{i:04d}.jpg").write_bytes(os.urandom(2000 + i))
    (data / "train.parquet").write_bytes(os.urandom(BIG_MIB << 20))
    toml = ['name = "datatest"', 'script = "train.py"', f"nnodes = {len(paths)}",
            f"hosts = {json.dumps([fleet.url(h) for h in fleet.cluster.hosts])}", "",
            "[[mounts]]", 'source = "data"', 'host = "/unused"', 'container = "/data"', 'check = "hashes"']  # fmt: skip
    for rank, p in enumerate(paths):
        toml += ["", f"[nodes.{rank}]", f'mounts = {{ "/data" = "{p}" }}']
    (project / "nodekit.toml").write_text("\n".join(toml) + "\n")
    (project / "train.py").write_text("print('hi')\n")
    return project, data, paths


def _push(fleet: Fleet, project: Path) -> tuple[int, str, int]:
    """`nodekit data push` on the head: its exit code, its output, the payload bytes it reports."""
    h0 = fleet.cluster.main
    done = h0.run(*nodekit_argv("data", "push", "--config", str(project / "nodekit.toml")), env=fleet.env,
                  cwd=project, timeout=120)  # fmt: skip
    out = done.stdout + done.stderr
    found = re.search(r"sent (\d+) bytes", out.strip().splitlines()[-1]) if out.strip() else None
    return done.returncode, out, int(found.group(1)) if found else -1


def _identical(data: Path, paths: list[Path]) -> None:
    from nodekit.launcher.datacheck.manifest import digest, first_differences, manifest

    want = manifest(str(data), hashes=True)
    for p in paths:
        have = manifest(str(p), hashes=True)
        assert digest(have) == digest(want), f"{p}: {first_differences(want, have)}"


def test_a_dataset_reaches_three_hosts_and_only_what_changed_travels(fleet: Fleet, tmp_path: Path) -> None:
    project, data, paths = _project(fleet, tmp_path)
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    h0 = fleet.cluster.main

    code, out, sent = _push(fleet, project)
    assert code == 0, out
    _identical(data, paths)
    assert sent == 3 * total, out  # one stream per host (relay chains are not built yet)

    before = head_tx(h0)
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 0, out
    assert head_tx(h0) - before < 1 << 20  # scans only: the receiver's code and the manifests, no payload

    changed = data / "shards" / "0042.jpg"
    changed.write_bytes(os.urandom(5000))
    (data / "shards" / "0007.jpg").rename(data / "moved.jpg")  # a rename travels as a copy on each node
    code, out, sent = _push(fleet, project)
    assert code == 0 and sent == 3 * 5000, out
    _identical(data, paths)

    damaged = paths[1] / "train.parquet"
    with open(damaged, "r+b") as f:
        f.seek(3 << 20)
        b = f.read(1)
        f.seek(3 << 20)
        f.write(bytes([b[0] ^ 0x01]))
    os.truncate(paths[1] / "shards" / "0100.jpg", 10)
    code, out, sent = _push(fleet, project)
    assert code == 0, out
    assert sent == (BIG_MIB << 20) + 2100, out  # the two damaged files, to the one host that lacked them
    _identical(data, paths)
