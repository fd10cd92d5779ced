"""Values reach the job byte for byte: Compose substitutes ``$VAR`` and ``${VAR:-default}`` from the
shell of whoever runs it, so nodekit writes every ``$`` as ``$$``. Proved on the real engine twice: what
``docker compose config`` makes of a file ``nodekit compose`` wrote, and what a container started by
``nodekit up`` sees (its argv, its environment, its mounts), with a shell full of decoys for every name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

IMAGE = "nodekit-test/literal:1"
# Every value holds something Compose would rewrite or a shell would split: $, $$, ${X:-y}, quotes, spaces,
# unicode, a trailing backslash; and the name has a dot, which Compose refuses in a project name.
ARGS = ["exp-$USER-${RUN:-default}", "cost=$HOME", "$$", "${X:-y}", "a'b\"c d", "ünï ✓", "tail\\"]
ENV = {"EXPERIMENT": "exp-$USER-${RUN:-default}", "PRICE": "$5 and $$", "QUOTED": "'$HOME' \"$HOME\"\\"}
MOUNT_HOST = "data $DATA ${X:-y} ü'\\"
MOUNT_TARGET = "/data/$1 ${X:-y} ü\\"
OUTPUT_DIR = "out-$USER"
# What the shell that runs nodekit (and so compose) holds: were anything substituted, these would show.
DECOYS = {"USER": "decoy-user", "RUN": "decoy-run", "HOME": "/decoy/home", "DATA": "decoy-data", "X": "decoy-x"}
SECRET_FROM_SHELL = "hf-token-$HOME-passed-by-name"
# The image's entrypoint: what the container was given, as JSON in /outputs.
DUMP = (
    "import json, os, sys; "
    "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ), 'mounted': os.listdir(os.environ['MOUNT_TARGET'])}, "
    "open('/outputs/seen.json', 'w'))"
)


def _toml(project: Path, port: int) -> str:
    def s(v: str) -> str:
        return json.dumps(v, ensure_ascii=False)

    env = "".join(f"{k} = {s(v)}\n" for k, v in {**ENV, "MOUNT_TARGET": MOUNT_TARGET}.items())
    return (
        f'name = "literal.v1"\nscript = "train.py"\nnproc_per_node = 1\nmaster_port = {port}\n'
        f'args = [{", ".join(s(a) for a in ARGS)}]\noutput_dir = {s(OUTPUT_DIR)}\npass_env = ["HF_TOKEN"]\n'
        f'[[mounts]]\nhost = {s(str(project / MOUNT_HOST))}\ncontainer = {s(MOUNT_TARGET)}\ncheck = "sizes"\n'
        f"[env]\n{env}"
    )


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "train.py").write_text("print('never run: the entrypoint dumps what it got')\n")
    (tmp_path / MOUNT_HOST).mkdir()
    (tmp_path / MOUNT_HOST / "marker.txt").write_text("here\n")
    (tmp_path / "nodekit.toml").write_text(_toml(tmp_path, 29731))
    yield tmp_path
    subprocess.run(
        [sys.executable, "-m", "nodekit", "down", "--node-rank", "0", "--config", str(tmp_path / "nodekit.toml")],
        capture_output=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def dump_image(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A small image whose entrypoint records its argv, environment and mounts (no torch: only compose's part is
    under test here)."""
    ctx = tmp_path_factory.mktemp("literal-image")
    (ctx / "Dockerfile").write_text(f'FROM nodekit/base:bookworm\nENTRYPOINT ["python3", "-c", {json.dumps(DUMP)}]\n')
    subprocess.run(["docker", "build", "-q", "-t", IMAGE, str(ctx)], check=True, capture_output=True, timeout=300)
    yield IMAGE
    subprocess.run(["docker", "image", "rm", "-f", IMAGE], capture_output=True, timeout=120)


def _shell() -> dict[str, str]:
    return os.environ | DECOYS | {"HF_TOKEN": SECRET_FROM_SHELL}


def _nodekit(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodekit", *args, "--config", str(project / "nodekit.toml")],
        capture_output=True,
        text=True,
        env=_shell(),
        cwd=project,
        timeout=300,
    )


def test_compose_config_reads_every_value_back_as_written(project: Path, dump_image: str) -> None:
    made = _nodekit(project, "compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", dump_image)
    assert made.returncode == 0, made.stderr
    out = subprocess.run(
        ["docker", "compose", "-f", str(project / "compose" / "node-0.yaml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=_shell(),
        timeout=60,
        check=True,
    ).stdout
    svc = json.loads(out)["services"]["train"]
    # `config` prints a file Compose could read again, so a literal "$" comes back written "$$".
    assert [a.replace("$$", "$") for a in svc["command"]] == ["train.py", *ARGS]
    env = {k: v.replace("$$", "$") if v is not None else v for k, v in svc["environment"].items()}
    assert {k: env[k] for k in ENV} == ENV
    assert env["HF_TOKEN"] == SECRET_FROM_SHELL.replace("$$", "$")  # pass_env: the shell's value, by design
    binds = {v["target"].replace("$$", "$"): v["source"].replace("$$", "$") for v in svc["volumes"]}
    assert binds[MOUNT_TARGET] == str(project / MOUNT_HOST)
    assert binds["/outputs"] == str(project / OUTPUT_DIR)


def test_the_running_job_gets_args_env_and_mounts_byte_for_byte(project: Path, dump_image: str) -> None:
    started = _nodekit(project, "up", "--node-rank", "0", "--main", "127.0.0.1", "--image", dump_image)
    assert started.returncode == 0, started.stdout + started.stderr
    seen = json.loads((project / OUTPUT_DIR / "seen.json").read_text())  # the output dir's own name, literal
    assert seen["argv"] == ["train.py", *ARGS]
    assert {k: seen["env"][k] for k in ENV} == ENV
    assert seen["env"]["MOUNT_TARGET"] == MOUNT_TARGET and seen["mounted"] == ["marker.txt"]
    assert seen["env"]["HF_TOKEN"] == SECRET_FROM_SHELL  # pass_env still takes the shell's value
    assert not any(d in json.dumps(seen, ensure_ascii=False) for d in DECOYS.values())
