"""The last line names the cause on main too (issue 46 item 4): a by-hand job whose failing rank is on the other node.

Main's `nodekit up` follows node 0's output only; rank 1's traceback is in node 1's. The failing node's launcher
publishes what its worker raised with its done mark (the worker's hook kept it), so main's closing line quotes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.helpers import CLASSIC_HOST, nodekit

pytestmark = pytest.mark.docker


def test_main_s_last_line_quotes_the_exception_rank_1_raised_on_the_other_node(
    probe_project: Callable[[str], Path],
) -> None:
    project = probe_project(CLASSIC_HOST)
    config = project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29830", "--nnodes", "2", "--script", "boom.py"]
    try:
        bg = nodekit("up", "--node-rank", "1", "--detach", *flags, config=config)
        assert bg.returncode == 0, bg.stdout[-3000:] + bg.stderr[-3000:]
        main = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=300)
        worker = nodekit("logs", "--node-rank", "1", config=config)
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
    said = main.stdout + main.stderr
    assert main.returncode != 0, said
    # The traceback is only in node 1's output; main names the exception all the same, from node 1's done mark.
    assert "[rank1]" not in said, said  # main never saw rank 1's traceback
    assert "node 1 (" in said and "worker rank 1 (local rank 0) raised RuntimeError: boom on rank 1" in said, said
    # ... and so does nodekit up's own last line: main exits 19 (node 1 failed first), and says why.
    last = [line for line in main.stderr.splitlines() if line.strip()][-1]
    assert main.returncode == 19, said
    assert "the job exited with code 19: node 1 (" in last, last
    assert "worker rank 1 (local rank 0) raised RuntimeError: boom on rank 1" in last, last
    assert "RuntimeError: boom on rank 1" in worker.stdout, worker.stdout[-3000:]
