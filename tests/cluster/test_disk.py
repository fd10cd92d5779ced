"""A node without room for the image is refused before anything moves, over real SSH.

h1's Docker data root is a small tmpfs (96 MiB); h0 pushes an image that needs more than that to ``ssh://root@h1``.
The survey reads h1's free disk with ``df`` over the node's SSH connection (``docker info`` does not say it, and
the head cannot statvfs another machine), and the plan refuses: the message names the node, its free space and the
space the load needs; the head's link carries only the survey's few KiB, and h1 has no image and no load ran.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.cluster.harness import find_dockerd, sh
from tests.cluster.helpers import REF, Fleet, head_tx, ids, make_image, push_argv, push_env

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

SMALL_MIB = 96
IMAGE_MIB = 64  # random bytes: the load needs about 2.2 x 64 MiB, more than the small disk holds


def test_a_node_without_room_is_refused_before_anything_moves(fleet: Fleet) -> None:
    h0, h1, h2 = fleet.cluster.hosts
    dockerd = find_dockerd()
    assert dockerd is not None
    for h in (h0, h2):  # only this test's image: the session's demo image on h0 stays for later tests
        if h.image_id(REF):
            h.docker("rmi", "-f", REF)

    def restart_h1() -> None:  # stop() ends every process of the host, its sshd among them
        h1.start(dockerd)
        h1.wait_ready()
        h1.start_sshd(fleet.keys.public(fleet.keys.client_key), fleet.keys.host_key)

    h1.stop()  # its engine restarts on a small file system of its own
    sh("mount", "-t", "tmpfs", "-o", f"size={SMALL_MIB}m", "nodekit-small-disk", str(h1.data_root))
    try:
        restart_h1()
        free = os.statvfs(h1.data_root)
        assert free.f_bavail * free.f_frsize < 2 * IMAGE_MIB << 20
        want = make_image(h0, REF, seed=random.randrange(1 << 30), mib=IMAGE_MIB)
        before = head_tx(h0)
        done = h0.run(*push_argv(fleet, h1, h2, relay="auto"), env=push_env(fleet), timeout=300)
        sent = head_tx(h0) - before
        assert done.returncode == 1, done.stdout + done.stderr
        err = done.stderr.strip().splitlines()[-1]
        assert "[h1] h1 has " in err and " MiB free for Docker" in err, err
        assert f"loading {REF} needs about 14" in err, err  # 2.2 x 64 MiB: 140.8 MiB
        assert "docker system prune" in err, err
        # Refused before anything moved: to no node (h2 had room, and is not sent half a push either).
        assert ids(h1) == set() and h2.image_id(REF) is None
        assert sent < 1 << 20, f"the head's link sent {sent} bytes for a refused push"
        # With room the same image goes through to the other node: the check reads each node's own disk.
        done = h0.run(*push_argv(fleet, h2, relay="never"), env=push_env(fleet), timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert h2.image_id(REF) == want
    finally:
        h1.stop()  # also unmounts the small file system (the harness unmounts everything under the data root)
        restart_h1()
