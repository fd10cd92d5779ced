"""The ``nodekit`` command. Each command parses, makes one call into nodekit, and prints.

Heavy modules (python-on-whales, rich, the build pipeline) are imported inside the commands so that
``nodekit --help`` answers at once. Commands live by topic in the modules imported below.
"""

from __future__ import annotations

import importlib

from nodekit.cli.common import TOPICS, app

# Importing a topic module registers its commands on the app; the backends' modules are named by their
# registrations (nodekit/config/backends.py), so a new backend's CLI module needs no line here.
for _topic in TOPICS:
    importlib.import_module(f"nodekit.cli.{_topic}")

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="nodekit")


if __name__ == "__main__":
    main()
