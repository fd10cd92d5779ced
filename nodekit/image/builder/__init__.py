"""``nodekit build`` and the image it makes: lock, fingerprint, then build with BuildKit only when the stack changed.

One module per responsibility:

- :mod:`~nodekit.image.builder.tree`: walk, hash and stage a tree with Docker's .dockerignore semantics (the code, the
  launcher);
- :mod:`~nodekit.image.builder.planning`: the build plan of the project as it is now, and its fingerprint;
- :mod:`~nodekit.image.builder.staging`: the build contexts under ``<project>/.nodekit/build/``, one build at a time;
- :mod:`~nodekit.image.builder.driver`: :func:`build` itself (BuildKit installs the package layers, nodekit writes and
  loads the image from blobs it holds);
- :mod:`~nodekit.image.builder.bases`: the base image's layers as the image's manifest names them;
- :mod:`~nodekit.image.builder.record`: the result and ``.nodekit/last-build.json``;
- :mod:`~nodekit.image.builder.selection`: which image ``nodekit up`` runs when none is named (:func:`choose`);
- :mod:`~nodekit.image.builder.inspection`: ``nodekit inspect`` (:func:`inspect_image`).

The names below are the package's interface; callers import them from ``nodekit.image.builder``.
"""

from __future__ import annotations

from nodekit.image.builder.driver import build
from nodekit.image.builder.inspection import StackReport, inspect_image, layers, stack_from_probe
from nodekit.image.builder.planning import STAGE_DIR, dockerfile_text, plan, project_fingerprint
from nodekit.image.builder.record import LAST_BUILD, BuildResult, human_size, last_build
from nodekit.image.builder.selection import BUILD_FIX, Choice, choose, current_image
from nodekit.image.builder.staging import build_lock
from nodekit.image.builder.tree import code_rules, hash_tree, launcher_tree

__all__ = [
    "BUILD_FIX",
    "LAST_BUILD",
    "STAGE_DIR",
    "BuildResult",
    "Choice",
    "StackReport",
    "build",
    "build_lock",
    "choose",
    "code_rules",
    "current_image",
    "dockerfile_text",
    "hash_tree",
    "human_size",
    "inspect_image",
    "last_build",
    "launcher_tree",
    "layers",
    "plan",
    "project_fingerprint",
    "stack_from_probe",
]
