"""Render one node's compose document from its spec and this host's facts.

The result is self-contained: ``docker compose -f compose/node-<rank>.yaml up`` by hand does what
``nodekit up`` does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from nodekit import __version__
from nodekit.job.container import ulimits
from nodekit.job.env import OUTPUT_DIR_IN_CONTAINER, rank_env
from nodekit.job.spec import NodeSpec
from nodekit.system.assets import compose_template
from nodekit.system.host.facts import HostFacts

SERVICE = "train"
# `docker compose up` exits 0 even when the job failed unless it is told to return the service's own code.
BY_HAND_FLAGS = f"--abort-on-container-exit --exit-code-from {SERVICE}"


def project_name(name: str, rank: int) -> str:
    """The compose project of one node; the same name by hand and through nodekit. Compose refuses a "." in a
    project name, which image names (and so a project directory like ``model.v2``) may hold: it becomes "_"."""
    return f"nodekit-{name.replace('.', '_')}-node{rank}"


def compose_filename(rank: int) -> str:
    return f"node-{rank}.yaml"


def render_compose(
    node: NodeSpec,
    image: str,
    facts: HostFacts,
    *,
    output_dir: Path,
    debug: bool = False,
    template: dict[str, Any] | None = None,
    image_id: str = "",
    job_secret: str = "",
) -> dict[str, Any]:
    """The compose document for ``node`` running ``image`` on a host with ``facts``.

    ``output_dir`` is the absolute host directory mounted at /outputs. ``image_id``, when known (the image is on
    this host), goes to NODEKIT_IMAGE_ID so that preflight compares the image itself, not only its fingerprint.
    ``job_secret`` goes to NODEKIT_JOB_SECRET: the launcher's store refuses nodes without it (nodekit/job/secret.py).
    Nothing is read from the environment, and nothing in the file is substituted from one: see :func:`literal`.
    """
    doc = copy.deepcopy(template if template is not None else compose_template())
    svc: dict[str, Any] = doc["services"][SERVICE]
    launch = node.launch
    doc = {"name": project_name(launch.name, node.rank), **doc}
    svc["image"] = image
    # Never pull: the image is nodekit's own build, shipped and verified by id on every node before the start; a
    # registry holds nothing of it, and a pull would only turn "not on this node" into a confusing Docker Hub error.
    svc["pull_policy"] = "never"
    svc["command"] = launch.command.argv()
    svc["environment"] = _environment(node, facts, debug=debug, image_id=image_id, job_secret=job_secret)
    svc["labels"] = {
        "org.nodekit.name": launch.name,
        "org.nodekit.rank": str(node.rank),
        "org.nodekit.nnodes": str(launch.nnodes),
        "org.nodekit.version": __version__,
    }
    svc["volumes"] = _volumes(node, output_dir)
    svc["ulimits"] = ulimits(facts)
    if facts.gpu_count > 0:
        # Compose 2.26 has no service-level `gpus:` key; device reservations are the portable spelling.
        svc["deploy"] = {
            "resources": {
                "reservations": {"devices": [{"driver": "nvidia", "count": _gpus(node), "capabilities": ["gpu"]}]}
            }
        }
    if node.infiniband:
        svc["devices"] = [f"{d}:{d}" for d in node.infiniband]
        svc["cap_add"] = ["IPC_LOCK"]
    if node.network == "bridge":
        # All-local runs only (spec refuses bridge otherwise). Node 0 publishes the rendezvous ports on the
        # bridge gateway, which is MASTER_ADDR for every node; gloo and NCCL then connect container to container.
        svc["network_mode"] = "bridge"
        if node.is_main:
            ports = (launch.master_port, launch.preflight_port)
            svc["ports"] = [f"{node.main_addr}:{p}:{p}/tcp" for p in ports]
    escaped: dict[str, Any] = literal(doc)
    return escaped


def _environment(
    node: NodeSpec, facts: HostFacts, *, debug: bool, image_id: str, job_secret: str
) -> dict[str, str | None]:
    """The service's environment: the rank's variables, the image id and job secret when given, then each
    ``pass_env`` name without a value."""
    env: dict[str, str | None] = dict(rank_env(node, facts, debug=debug))
    if image_id:
        env["NODEKIT_IMAGE_ID"] = image_id
    if job_secret:
        env["NODEKIT_JOB_SECRET"] = job_secret
    # A name without a value: compose takes it from the environment of whoever runs `docker compose up` (or
    # `nodekit up`), so a secret never lands in this file, a label, or nodekit's output.
    env |= {name: None for name in node.launch.pass_env if name not in env}
    return env


def _volumes(node: NodeSpec, output_dir: Path) -> list[dict[str, Any]]:
    """The service's bind mounts: ``output_dir`` at /outputs, then the node's declared mounts."""
    volumes: list[dict[str, Any]] = [
        {
            "type": "bind",
            "source": str(output_dir),
            "target": OUTPUT_DIR_IN_CONTAINER,
            "bind": {"create_host_path": True},
        }
    ]
    for m in node.mounts:
        # create_host_path false: a missing dataset must be an error, not an empty directory Docker made.
        volumes.append(
            {
                "type": "bind",
                "source": m.host,
                "target": m.container,
                "read_only": not m.writable,
                "bind": {"create_host_path": False},
            }
        )
    return volumes


def literal(value: Any) -> Any:
    """``value`` with every ``$`` in its strings written ``$$``, which Compose reads back as one ``$``.

    Compose substitutes ``$VAR`` and ``${VAR:-default}`` from the shell of whoever runs it, in every value of the
    file: unescaped, ``exp-$USER`` in args would reach the job as the runner's user name, and under ``nodekit run``
    the head's shell would fill every node's values (a secret included). Values in nodekit's files are literal;
    a variable is taken from the shell only by name, on purpose: ``pass_env`` (a key without a value, untouched).
    """
    return map_strings(value, lambda s: s.replace("$", "$$"))


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` with ``fn`` applied to every string in it, through dicts' values and lists (keys kept)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [map_strings(v, fn) for v in value]
    return value


def _gpus(node: NodeSpec) -> int | str:
    """The GPUs the container reserves: this node's declared [nodes.R] gpus, else all of them."""
    declared = node.launch.node_gpus[node.rank] if node.rank < len(node.launch.node_gpus) else None
    return "all" if declared is None else declared


def to_yaml(doc: dict[str, Any], *, rank: int, nnodes: int, path_hint: str) -> str:
    """The file's text: a header saying what it is and how to run it by hand, then the document."""
    header = (
        f"# Generated by nodekit {__version__}: node {rank} of {nnodes} (ranks 0..{nnodes - 1}).\n"
        f"# Run it by hand with:  docker compose -f {path_hint} up {BY_HAND_FLAGS}\n"
        "# (those two flags make `docker compose up` exit with the job's exit code)\n"
        "# Regenerate with nodekit compose rather than editing; edits are overwritten.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
