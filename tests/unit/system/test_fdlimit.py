"""The head's open-file limit (nodekit/system/fdlimit.py): ``nodekit run`` holds two descriptors per node for the
whole job (each follower's pipes), past the soft limit of 1,024 that most Linux logins start with from about 400
nodes on. The limit is raised where the hard one allows, or refused in one line before
anything starts. Each case runs in a child process whose limits it sets, as a login shell's ``ulimit -n`` does."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from nodekit.system.fdlimit import wanted

# In the child: its soft and hard limits set first (argv 1 and 2), then ensure_open_files(argv 3), then as many pipes
# as that many descriptors. Prints the soft limit it ended with, or the error's one line.
CHILD = r"""
import os, resource, sys
soft, hard, need = (int(x) for x in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from nodekit.errors import NodekitError
from nodekit.system.fdlimit import ensure_open_files
try:
    ensure_open_files(need)
except NodekitError as e:
    print(f"refused exit {e.exit_code}: {e.message} Fix: {e.fix}")
    sys.exit(0)
pipes = [os.pipe() for _ in range(need // 2 - 16)]
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], "pipes", len(pipes))
"""


def child(soft: int, hard: int, need: int) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, str(soft), str(hard), str(need)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(hard_limit() < 4096, reason="this machine's hard open-file limit is under 4096")
def test_a_run_that_needs_more_than_the_soft_limit_raises_it_and_opens_them() -> None:
    assert child(256, 4096, 1600) == "soft 1600 pipes 784"


def test_a_hard_limit_too_low_is_refused_in_one_line_before_anything_opens() -> None:
    said = child(256, 512, 1600)
    assert said.startswith("refused exit 2: ") and "\n" not in said, said
    assert "1600 open files" in said and "512" in said and "ulimit -Hn" in said, said


def test_the_soft_limit_is_only_ever_raised() -> None:
    assert wanted(soft=1024, hard=4096, need=1600) == 1600
    assert wanted(soft=20000, hard=65536, need=1600) is None
    assert wanted(soft=1024, hard=resource.RLIM_INFINITY, need=1600) == 1600
    assert wanted(soft=resource.RLIM_INFINITY, hard=resource.RLIM_INFINITY, need=10**6) is None
    with pytest.raises(ValueError):
        wanted(soft=1024, hard=1500, need=1600)
