"""The real nodekit CLI with some of its constants changed: ``python -m tests.cluster.patched MODULE.NAME=SECONDS ...
-- ARGS``. A fault test shortens a production deadline (a 60 s stall, a 120 s answer) to a few seconds this way,
without a setting users would see; everything else is the command a user runs."""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str]) -> None:
    sep = argv.index("--")
    for item in argv[:sep]:
        name, value = item.split("=", 1)
        module, attr = name.rsplit(".", 1)
        target = importlib.import_module(module)
        assert hasattr(target, attr), f"{module} has no {attr}"
        setattr(target, attr, float(value))
    sys.argv = ["nodekit", *argv[sep + 1 :]]
    from nodekit.cli.app import main as cli

    cli()


if __name__ == "__main__":
    main(sys.argv[1:])
