"""Render one node's compose document from its container spec (nodekit/job/container.py), pure.

The result is self-contained: ``docker compose -f compose/node-<rank>.yaml up`` by hand does what
``nodekit up`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import yaml

from nodekit import __version__
from nodekit.job.container import IMAGE_ID, MAIN_ADDR, RANK, ContainerSpec, Mount, Value

SERVICE = "train"
# `docker compose up` exits 0 even when the job failed unless it is told to return the service's own code.
BY_HAND_FLAGS = f"--abort-on-container-exit --exit-code-from {SERVICE}"


def project_name(name: str, rank: int) -> str:
    """The compose project of one node; the same name by hand and through nodekit. Compose refuses a "." in a
    project name, which image names (and so a project directory like ``model.v2``) may hold: it becomes "_"."""
    return f"nodekit-{name.replace('.', '_')}-node{rank}"


def compose_filename(rank: int) -> str:
    return f"node-{rank}.yaml"


def render_compose(spec: ContainerSpec, *, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose document of ``spec``: a pure rendering, its holes filled with what planning knew (the rank,
    main's address, the image id; NODEKIT_IMAGE_ID is left out when the id was not looked up).

    ``secrets`` holds the values of ``spec.secrets`` (the job secret), written into the file, which is therefore
    written 0600 (backends/compose/node.py). ``pass_env`` names are written without a value: Compose takes them from
    the environment of whoever runs it. Nothing is read from the environment, and nothing in the file is
    substituted from one: see :func:`literal`.
    """
    if spec.main_addr is None:
        raise ValueError("a compose file needs main's address (plan the node with it)")
    svc: dict[str, Any] = {
        "network_mode": spec.network,
        "ipc": spec.ipc,
        # A finished or failed job stays finished. Retries belong to torchrun (max_restarts), which restarts every
        # worker of every node together; a container restart would rejoin a dead rendezvous.
        "restart": "no",
        "stop_grace_period": f"{spec.stop_grace_s}s",
        "init": spec.init,
        "working_dir": spec.workdir,
        "image": spec.image,
        # Never pull: the image is nodekit's own build, shipped and verified by id on every node before the start; a
        # registry holds nothing of it, and a pull would only turn "not on this node" into a confusing Docker Hub
        # error.
        "pull_policy": "never",
        "command": list(spec.command),
        "environment": _environment(spec, secrets or {}),
        "labels": {k: fill(spec, v) for k, v in spec.labels},
        "volumes": [_volume(m) for m in spec.mounts],
        "ulimits": {u.name: {"soft": u.soft, "hard": u.hard} for u in spec.ulimits},
    }
    if spec.gpus is not None:
        # Compose 2.26 has no service-level `gpus:` key; device reservations are the portable spelling.
        svc["deploy"] = {
            "resources": {
                "reservations": {"devices": [{"driver": "nvidia", "count": spec.gpus, "capabilities": ["gpu"]}]}
            }
        }
    if spec.devices:
        svc["devices"] = [f"{d}:{d}" for d in spec.devices]
    if spec.cap_add:
        svc["cap_add"] = list(spec.cap_add)
    if spec.ports:
        svc["ports"] = [f"{spec.main_addr}:{p}:{p}/tcp" for p in spec.ports]
    doc = {"name": project_name(spec.name, spec.rank), "services": {SERVICE: svc}}
    escaped: dict[str, Any] = literal(doc)
    return escaped


def fill(spec: ContainerSpec, value: Value) -> str:
    """A hole filled with what planning knew (compose renders one node on the machine that runs it)."""
    if value == RANK:
        return str(spec.rank)
    if value == MAIN_ADDR:
        return str(spec.main_addr)
    if value == IMAGE_ID:
        return spec.image_id
    if isinstance(value, str):
        return value
    raise ValueError(f"compose cannot fill {value}")  # a hole this renderer does not know must not pass silently


def _environment(spec: ContainerSpec, secrets: Mapping[str, str]) -> dict[str, str | None]:
    """The service's environment: the variables (NODEKIT_IMAGE_ID only when the id is known), the secrets' values,
    then each ``pass_env`` name without a value."""
    env: dict[str, str | None] = {
        v.name: fill(spec, v.value) for v in spec.env if not (v.value == IMAGE_ID and not spec.image_id)
    }
    env |= {name: secrets[name] for name in spec.secrets}
    # A name without a value: compose takes it from the environment of whoever runs `docker compose up` (or
    # `nodekit up`), so a secret never lands in this file, a label, or nodekit's output.
    env |= {name: None for name in spec.pass_env if name not in env}
    return env


def _volume(m: Mount) -> dict[str, Any]:
    """A bind mount; create_host_path false for the declared mounts: a missing dataset must be an error, not an
    empty directory Docker made."""
    volume: dict[str, Any] = {"type": "bind", "source": m.source, "target": m.target}
    if not m.create:
        volume["read_only"] = m.read_only
    volume["bind"] = {"create_host_path": m.create}
    return volume


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


def to_yaml(doc: dict[str, Any], *, rank: int, nnodes: int, path_hint: str) -> str:
    """The file's text: a header saying what it is and how to run it by hand, then the document."""
    header = (
        f"# Generated by nodekit {__version__}: node {rank} of {nnodes} (ranks 0..{nnodes - 1}).\n"
        f"# Run it by hand with:  docker compose -f {path_hint} up {BY_HAND_FLAGS}\n"
        "# (those two flags make `docker compose up` exit with the job's exit code)\n"
        "# Regenerate with nodekit compose rather than editing; edits are overwritten.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
