"""``python -m nodekit.launcher.stacks [--dir DIR]``: the stacks of the job's processes in this container, as one
JSON document on standard output (:func:`nodekit.launcher.stacks.collect.to_json`). ``nodekit stacks`` runs it on
every node through ``docker exec``; the host groups what every node printed."""

from __future__ import annotations

import sys

from nodekit.launcher.stacks.collect import DEFAULT_DIR, dump_all, to_json


def main(argv: list[str]) -> int:
    directory = DEFAULT_DIR
    if argv[:1] == ["--dir"] and len(argv) == 2:
        directory = argv[1]
    elif argv:
        print("usage: python -m nodekit.launcher.stacks [--dir DIR]", file=sys.stderr)
        return 2
    print(to_json(dump_all(directory)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
