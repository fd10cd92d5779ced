"""Pure: one rank's :class:`~nodekit.job.container.ContainerSpec`, decided from its node and its host's facts.

Every backend calls :func:`plan_container`, once per rank: ``nodekit up`` and ``nodekit run`` (compose), ``nodekit
slurm`` and ``nodekit k8s``; each then renders the spec, filling its holes its own way. Nothing here reads the
environment, files, the network or an engine.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import PurePath

from nodekit import __version__
from nodekit.job.container import IMAGE_ID, RANK, ContainerSpec, EnvVar, Mount, ulimits
from nodekit.job.env import node_env
from nodekit.job.spec import NodeSpec
from nodekit.launcher.contract import OUTPUT_DIR, Env, Label
from nodekit.system.host.facts import HostFacts


def plan_container(
    node: NodeSpec,
    facts: HostFacts,
    *,
    image: str,
    output_dir: str | PurePath,
    image_id: str = "",
    job_secret: bool = False,
    debug: bool = False,
) -> ContainerSpec:
    """The container of node ``node.rank`` running ``image`` on a host with ``facts`` (the node's, with the config's
    per-node pins applied: :func:`nodekit.job.spec.pinned_host_facts`).

    ``output_dir`` is the absolute host directory mounted at /outputs. ``image_id`` is the image's id when planning
    looked it up ("" otherwise); NODEKIT_IMAGE_ID is always declared (a hole: the backend knows the id on the node,
    or leaves the variable out), so that preflight compares the image itself, not only its fingerprint.
    ``job_secret``: the job has a secret, passed by name as NODEKIT_JOB_SECRET (the launcher's store refuses nodes
    without it, nodekit/job/secret.py)."""
    launch = node.launch
    mounts = _mounts(node, str(output_dir))
    declared = launch.node_gpus[node.rank] if node.rank < len(launch.node_gpus) else None
    limits = ulimits(facts)
    env = (*node_env(node, facts, debug=debug), EnvVar(Env.IMAGE_ID, IMAGE_ID))
    return ContainerSpec(
        name=launch.name,
        rank=node.rank,
        nnodes=launch.nnodes,
        image=image,
        command=tuple(launch.command.argv()),
        env=env,
        secrets=(Env.JOB_SECRET,) if job_secret else (),
        pass_env=tuple(n for n in launch.pass_env if n not in {v.name for v in env}),
        labels=(
            (Label.NAME, launch.name),
            (Label.RANK, RANK),
            (Label.NNODES, str(launch.nnodes)),
            (Label.VERSION, __version__),
        ),
        mounts=mounts,
        ulimits=limits,
        # The GPUs the container reserves: this node's declared [nodes.R] gpus, else all of them.
        gpus=None if facts.gpu_count == 0 else ("all" if declared is None else declared),
        devices=node.infiniband,
        # RDMA registers (pins) memory: the container may lock it.
        cap_add=("IPC_LOCK",) if node.infiniband else (),
        network=node.network,
        # All-local runs only (spec refuses bridge otherwise). Node 0 publishes the rendezvous ports on the bridge
        # gateway, which is MASTER_ADDR for every node; gloo and NCCL then connect container to container.
        ports=(launch.master_port, launch.preflight_port) if node.network == "bridge" and node.is_main else (),
        main_addr=node.main_addr,
        image_id=image_id,
    )


def _mounts(node: NodeSpec, output_dir: str) -> tuple[Mount, ...]:
    """``output_dir`` at /outputs (made when missing), then the node's declared mounts."""
    outputs = Mount(source=output_dir, target=OUTPUT_DIR, read_only=False, create=True)
    return (outputs, *(Mount(m.host, m.container, read_only=not m.writable) for m in node.mounts))


def unset_pass_env(names: tuple[str, ...], environ: Container[str]) -> tuple[str, ...]:
    """A warning for each pass_env variable the launching shell lacks (the job would run without it)."""
    return tuple(
        f"pass_env {n} is not set in this shell: the job runs without it (export {n}=... before nodekit up)"
        for n in names
        if n not in environ
    )
