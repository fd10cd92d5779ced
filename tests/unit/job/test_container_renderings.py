"""Every backend is a rendering of one ContainerSpec (issue 29): each field of the spec changes each backend's
output, or the backend says here why it does not render it. A field added to the spec and forgotten by a backend
fails this test instead of silently giving that backend another container (the guard Slurm's parse-back of compose
YAML kept with its list of known keys, now without parsing anything back)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodekit.backends.compose.render import render_compose
from nodekit.backends.fleet import start
from nodekit.backends.k8s import render as k8s
from nodekit.backends.slurm import modes
from nodekit.backends.slurm.job import InspectedImage, Sbatch, SlurmJob
from nodekit.backends.slurm.shell import words
from nodekit.config.settings import Settings
from nodekit.job.container import ContainerSpec, EnvVar, Mount, Ulimit
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.system.host.facts import HostFacts

FACTS = HostFacts(gpu_count=4, infiniband=("/dev/infiniband/uverbs0",))
IMAGE = InspectedImage(ref="demo:1", id="sha256:" + "ab" * 32, entrypoint=("python", "-m", "nodekit.launcher"))

# One other value per field (ipc has only one).
OTHER: dict[str, Any] = {
    "name": "other",
    "rank": 0,
    "nnodes": 3,
    "image": "other:2",
    "command": ("other.py",),
    "env": (EnvVar("EXTRA", "1"),),
    "secrets": (),
    "pass_env": ("TOKEN",),
    "labels": (("extra", "1"),),
    "mounts": (Mount("/a", "/b", read_only=True),),
    "ulimits": (Ulimit("nofile", 1, 2),),
    "gpus": None,
    "devices": ("/dev/fuse",),
    "cap_add": ("SYS_PTRACE",),
    "network": "bridge",
    "ports": (1, 2),
    "init": False,
    "workdir": "/elsewhere",
    "stop_grace_s": 5,
    "main_addr": "10.0.0.9",
    "image_id": "sha256:" + "cd" * 32,
}
UNVARIED = {"ipc"}  # Literal["host"]: nothing else to render

# What each backend deliberately leaves to something else, and why.
NOT_RENDERED: dict[str, dict[str, str]] = {
    "compose": {"nnodes": "the file's header (to_yaml)"},
    "docker": {
        "rank": "a hole: the task's rank",
        "main_addr": "a hole: the allocation's first host",
        "image_id": "a hole: the id on the node's engine",
        "name": "the container's name is the Slurm job's",
        "nnodes": "the labels carry it",
        "ports": "host network only (plan_job refuses bridge)",
    },
    "charliecloud": {
        "rank": "a hole: the task's rank",
        "main_addr": "a hole: the allocation's first host",
        "name": "no container name",
        "nnodes": "the environment carries it",
        "image": "the SquashFS made from it (job.image_path)",
        "labels": "ch-run has none",
        "ulimits": "the task's own limits (ch-run starts no daemon-made process)",
        "devices": "ch-run shares the host's /dev",
        "cap_add": "no capabilities to add: an unprivileged user namespace",
        "network": "always the host's",
        "ports": "always the host's network",
        "init": "the task's bash waits for ch-run and passes its signals",
        "stop_grace_s": "Slurm's KillWait",
    },
    "fleet": {
        "name": "the container's name is its compose project's (fleet/start.py: container_name)",
        "nnodes": "the environment carries it",
        "ports": "host network only: a bridge network's node is started by compose up (start.startable)",
    },
    "k8s": {
        "rank": "a hole: the pod's completion index",
        "main_addr": "a hole: pod 0's DNS name",
        "image_id": "a hole left out: pods pull the image by name",
        "name": "the Job's name ([k8s] name)",
        "nnodes": "completions and the environment",
        "image": "the image the cluster pulls ([k8s] image)",
        "labels": "the manifests' own labels",
        "mounts": "volumes: plan.py's _volumes renders them with [k8s] claims",
        "ulimits": "a pod cannot set them",
        "gpus": "resources: [k8s] gpus, one count for every pod",
        "devices": "the cluster's device plugin",
        "cap_add": "the cluster's device plugin",
        "network": "the pod network, or [k8s] host_network",
        "ports": "the headless Service's",
    },
}


def base() -> ContainerSpec:
    s = Settings(project_dir=Path("/p"), name="demo", script="train.py", nnodes=2, pass_env=("WANDB_API_KEY",))
    node = node_spec(s, launch_spec(s), 1, None, FACTS)
    return plan_container(node, FACTS, image="demo:1", output_dir="/p/outputs", image_id="sha256:1", job_secret=True)


def slurm_job(spec: ContainerSpec, mode: str) -> SlurmJob:
    return SlurmJob(name="demo", mode=mode, image=IMAGE, image_path="/shared/demo.sqsh",  # type: ignore[arg-type]
                    sbatch=Sbatch(job_name="demo", nodes=2, output="/o/x"), nodes=(spec,), output_dir="/o")  # fmt: skip


def k8s_job(spec: ContainerSpec) -> k8s.K8sJob:
    return k8s.K8sJob(name="demo", namespace=None, image="r/demo:1", fingerprint="", nnodes=2, nproc=1, gpus=0,
                      container=spec, ports=(29500, 29501), volumes=())  # fmt: skip


RENDER: dict[str, Callable[[ContainerSpec], Any]] = {
    "compose": lambda c: render_compose(
        c if c.main_addr else dataclasses.replace(c, main_addr="10.0.0.5"), secrets={n: "s" * 16 for n in c.secrets}
    ),
    "docker": lambda c: words(modes.docker_args(slurm_job(c, "docker"), c)),
    "charliecloud": lambda c: (
        words(modes.container_env(slurm_job(c, "charliecloud"), c)),
        modes.passed_names(c),
        words(modes.charliecloud_args(slurm_job(c, "charliecloud"), c)),
    ),
    "k8s": lambda c: [k8s.indexed_job(k8s_job(c)), k8s.train_job(k8s_job(c))],
    "fleet": lambda c: start.run_args(
        c if c.main_addr else dataclasses.replace(c, main_addr="10.0.0.5"),
        project="nodekit-demo-node1",
        compose_file=Path("/p/compose/node-1.yaml"),
        compose_text="# node 1",
    ),
}


@pytest.mark.parametrize("backend", sorted(RENDER))
def test_every_field_is_rendered_or_said_why_not(backend: str) -> None:
    fields = {f.name for f in dataclasses.fields(ContainerSpec)}
    assert set(OTHER) | UNVARIED == fields, "a new ContainerSpec field: give it another value above"
    spec, render = base(), RENDER[backend]
    before = render(spec)
    unchanged = sorted(
        name for name, other in OTHER.items() if render(dataclasses.replace(spec, **{name: other})) == before
    )
    assert unchanged == sorted(NOT_RENDERED[backend]), f"{backend} ignores fields it does not say why it ignores"


def test_the_engine_s_grace_outlasts_torchrun_s_own_so_a_stopped_node_always_says_so() -> None:
    """docker stop's SIGKILL must not race torchrun's: the launcher needs the time after torchrun's own escalation
    to print the stop line and publish the done mark (test_container_signals' docker stop case got exit 137)."""
    from nodekit.job.container import STOP_GRACE_S
    from nodekit.launcher.contract import TORCHRUN_KILL_AFTER_S

    assert STOP_GRACE_S >= TORCHRUN_KILL_AFTER_S + 10
