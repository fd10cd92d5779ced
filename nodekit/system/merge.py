"""Several line streams (one per node) merged into one, lines as they come: ``nodekit logs`` of every node."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping

from nodekit.errors import NodekitError


def merged(
    sources: Mapping[int, Callable[[], Iterable[str]]], on_line: Callable[[int, str], None]
) -> dict[int, NodekitError]:
    """Read every source in a thread of its own and hand each line to ``on_line(key, line)`` in this thread, in the
    order the lines arrive, until every source has ended. Returns the sources that ended with a NodekitError (the
    others' lines still all arrive); any other exception is the caller's bug and ends its source's thread only."""
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    failures: dict[int, NodekitError] = {}

    def one(key: int, source: Callable[[], Iterable[str]]) -> None:
        try:
            for line in source():
                lines.put((key, line))
        except NodekitError as e:
            failures[key] = e
        finally:
            lines.put((key, None))

    for key, source in sources.items():
        threading.Thread(target=one, args=(key, source), daemon=True).start()
    ended = 0
    while ended < len(sources):
        key, line = lines.get()
        if line is None:
            ended += 1
        else:
            on_line(key, line)
    return failures
