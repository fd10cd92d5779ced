"""The ``nodekit`` command. Each command parses, makes one call into nodekit, and prints.

Heavy modules (python-on-whales, rich, the build pipeline) are imported inside the commands so that
``nodekit --help`` answers at once. Commands live by topic in the modules imported below.
"""

from __future__ import annotations

from nodekit.cli import data, doctor, fleet, images, k8s, live, nodes, project, runs, ship, slurm, stacks
from nodekit.cli.common import app

__all__ = [
    "app", "data", "doctor", "fleet", "images", "k8s", "live", "main", "nodes", "project", "runs", "ship", "slurm",
    "stacks",
]  # fmt: skip


def main() -> None:
    app(prog_name="nodekit")


if __name__ == "__main__":
    main()
