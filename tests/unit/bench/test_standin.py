"""benchmarks/_standin.py's stand-in engine, run for real by ``sh`` as an sshd session would run it: the head's check
reads its image as the head's own, the start's ``docker run`` makes a container that the follower finds by Compose's
label, waits for and follows to its end, and the end's ``stop`` and ``rm`` remove it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks._standin import DOCKER_SCRIPT, image_json
from benchmarks.scale_bench import _use_openssh
from nodekit.backends.fleet.image import is_this_image
from nodekit.backends.fleet.remote import parse_engine
from nodekit.system.docker.models import image_info_of
from tests.cluster.harness import ssh_client

REF = "nodekit/demo:standin"


def docker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "docker"
    if not script.exists():
        script.write_text(DOCKER_SCRIPT)
        script.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "NKS_STATE": str(tmp_path / "state"), "SSH_CONNECTION": "10.77.0.1 5 10.77.1.9 22"}
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=30)


def test_a_stand_in_host_answers_the_check_start_follow_and_end(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "ref").write_text(REF + "\n")
    (state / "image.json").write_text(json.dumps(image_json(REF)) + "\n")
    (state / "end_at").write_text(f"{int(time.time())}\n")
    said = parse_engine("image=" + docker(tmp_path, "image", "inspect", "--format", "{{json .}}", REF).stdout)
    assert said.image_known and is_this_image(image_info_of(image_json(REF)), said.image)
    assert "No such image" in docker(tmp_path, "image", "inspect", "other:1").stderr
    run = ["run", "--detach", "--name", "p-train-1", "--label=com.docker.compose.project=p", REF]
    assert docker(tmp_path, *run).returncode == 0
    assert (state / "10.77.1.9" / "c.p-train-1").is_file()  # the host it plays, from SSH_CONNECTION
    assert docker(tmp_path, "ps", "--all", "--quiet", "--filter", "label=com.docker.compose.project=p").stdout == (
        "p-train-1\n"
    )
    assert docker(tmp_path, "ps", "--all", "--quiet", "--filter", "label=com.docker.compose.project=q").stdout == ""
    assert docker(tmp_path, "container", "wait", "p-train-1").stdout == "0\n"  # within MIN_JOB_S of its start
    assert "final loss" in docker(tmp_path, "logs", "--follow", "p-train-1").stdout
    assert docker(tmp_path, "stop", "--time", "10", "p-train-1").returncode == 0
    assert docker(tmp_path, "rm", "--force", "p-train-1").returncode == 0
    assert docker(tmp_path, "ps", "--all", "--quiet").stdout == ""


def test_the_heads_ssh_is_the_chosen_openssh_with_the_users_config(tmp_path: Path) -> None:
    """scale_bench --openssh: the head's ssh wrapper runs the build's client with the same -F config, and says its
    version; 'system' goes back to the system's."""
    build = tmp_path / "openssh"
    (build / "usr/bin").mkdir(parents=True)
    fake = build / "usr/bin/ssh"
    fake.write_text('#!/bin/sh\necho "OpenSSH_10.0p2 Debian-7, OpenSSL 3.0.19" >&2\n')
    fake.chmod(0o755)
    bin_dir = ssh_client(tmp_path / "ssh", [SimpleNamespace(addr="10.77.1.1")], tmp_path / "key", "ssh-ed25519 AAAA")  # type: ignore[list-item]
    standins = SimpleNamespace(openssh=build)  # already that build's sshd: nothing restarted
    assert _use_openssh(standins, build, bin_dir) == "OpenSSH_10.0p2"  # type: ignore[arg-type]
    wrapper = (bin_dir / "ssh").read_text()
    assert f'exec {fake} -F {tmp_path / "ssh" / "ssh_config"} "$@"' in wrapper, wrapper
    standins.openssh = None
    assert _use_openssh(standins, None, bin_dir).startswith("OpenSSH_")  # type: ignore[arg-type]
    assert f"exec {shutil.which('ssh')} -F" in (bin_dir / "ssh").read_text()
