"""The environment of every child: this process's, plus what :func:`extra_env` adds for a while. ``os.environ``
itself is never changed: a change made for one push's shared SSH connections (PATH) must not reach every other
thread's children."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

_env_lock = threading.Lock()
_overlays: list[dict[str, str]] = []


def overlay() -> dict[str, str]:
    """The variables :func:`extra_env` adds right now (later entries win)."""
    with _env_lock:
        return {k: v for o in _overlays for k, v in o.items()}


def environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a child gets: this process's, then every :func:`extra_env` in force, then ``extra``."""
    return {**os.environ, **overlay(), **(extra or {})}


@contextlib.contextmanager
def extra_env(values: Mapping[str, str]) -> Iterator[None]:
    """While entered, every child started here (and the docker CLI python-on-whales starts, through
    :func:`command_prefix`) also gets ``values``, in every thread; ``os.environ`` stays as it is."""
    entry = dict(values)
    with _env_lock:
        _overlays.append(entry)
    try:
        yield
    finally:
        with _env_lock:
            _overlays[:] = [o for o in _overlays if o is not entry]
