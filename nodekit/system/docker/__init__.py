"""The only package that talks to Docker, Compose and Buildx, always through python-on-whales, which builds every
command line (it starts the docker CLI itself; the processes nodekit runs itself go through nodekit.system.proc).

- :mod:`~nodekit.system.docker.calls`: the client, the deadlines, the one way a call fails (``Engine.calling``), the
  batched queries, and the engine's own facts (:func:`check_engine`, :func:`runtimes`, :func:`engine_facts`).
- :mod:`~nodekit.system.docker.models`: what Docker's JSON is parsed into.
- :mod:`~nodekit.system.docker.compose`: a node's compose project: up, logs, ps, wait, exec, stop, down.
- :mod:`~nodekit.system.docker.images`: inspect, list, tag, remove, load an archive.
- :mod:`~nodekit.system.docker.containers`: throw-away containers (probes, doctor's test container).
- :mod:`~nodekit.system.docker.streams`: ``docker save``, ``docker load`` and a build's exported files as byte
  streams.

Functions take what they act on (an engine host, a compose file, a project name) and return plain models;
DockerException never leaves this package: it becomes an EngineError, ImageError or BuildError with a fix. The
names below are the package's interface: import them from ``nodekit.system.docker``. The deadlines are
:mod:`~nodekit.system.docker.calls`'s (``ENGINE_CALL_S`` ...), read there at every call: a test changes them there.
"""

from __future__ import annotations

from nodekit.errors import BuildError
from nodekit.system.docker.calls import (
    ENGINE_FIX,
    check_engine,
    client,
    compose_version,
    engine_facts,
    hung_fix,
    no_engine_line,
    runtimes,
)
from nodekit.system.docker.compose import (
    compose_down,
    compose_exec,
    compose_logs,
    compose_projects,
    compose_ps,
    compose_stop,
    compose_up,
    compose_wait,
    running,
)
from nodekit.system.docker.containers import probe_image, run_as_job, run_in_image
from nodekit.system.docker.images import (
    history_sizes,
    image_config,
    image_history,
    image_info,
    image_layers,
    images_labelled,
    layer_lists,
    load_archive,
    remove_image,
    require_image,
    tag_image,
)
from nodekit.system.docker.models import ContainerState, EngineFacts, EngineInfo, ImageInfo, Loaded
from nodekit.system.docker.streams import CHUNK, LoadSink, SaveStream, buildx_export

__all__ = [
    "CHUNK",
    "ENGINE_FIX",
    "BuildError",
    "ContainerState",
    "EngineFacts",
    "EngineInfo",
    "ImageInfo",
    "LoadSink",
    "Loaded",
    "SaveStream",
    "buildx_export",
    "check_engine",
    "client",
    "compose_down",
    "compose_exec",
    "compose_logs",
    "compose_projects",
    "compose_ps",
    "compose_stop",
    "compose_up",
    "compose_version",
    "compose_wait",
    "engine_facts",
    "history_sizes",
    "hung_fix",
    "image_config",
    "image_history",
    "image_info",
    "image_layers",
    "images_labelled",
    "layer_lists",
    "load_archive",
    "no_engine_line",
    "probe_image",
    "remove_image",
    "require_image",
    "run_as_job",
    "run_in_image",
    "running",
    "runtimes",
    "tag_image",
]
