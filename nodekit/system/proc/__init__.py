"""The one door to the outside: every process nodekit starts goes through here (the launcher, which runs inside
the image, keeps its own).

- :func:`run`: a command whose output is captured, under a deadline: its :class:`Result`, or the deadline's error
  (one line naming what hung) once it has been killed.
- :func:`start`: a command whose pipes the caller streams (docker save/load, ssh, zstd, mmdebstrap): a
  :class:`Child`. A child with a deadline is killed when it passes, and :meth:`Child.check` raises the error.
- :func:`command_prefix`: for the docker CLI that python-on-whales starts itself (nodekit.system.docker): the same
  environment and the same deadline, as an argv prefix (GNU timeout(1)); :func:`stopped` recognises its exit.
- :func:`environ`, :func:`extra_env`: the environment every child gets. ``os.environ`` is never changed.
- :func:`terminate_all`: for a signal handler: every live child started here is ended (its process group when it
  has one: SIGTERM, then SIGKILL after a grace).
- :func:`stopping`: the signal handling of every command (installed by the CLI): SIGHUP, SIGINT and SIGTERM end
  every child and raise :class:`Interrupted`, so the command's own cleanup runs and the CLI exits 128 + signal.

Every call names its deadline: seconds, a :class:`Stall` (no progress for that long: streams), or :class:`Unbounded`
saying what bounds the call instead. Every process starts in :func:`nodekit.system.proc.spawn._popen`: tests replace
that one function (tests/unit/conftest.py, fake_runner).
"""

from __future__ import annotations

from nodekit.system.proc.children import Child, alive, live, terminate_all
from nodekit.system.proc.deadlines import KILL_AFTER_S, TIMEOUT_CODES, Deadline, Stall, Unbounded, hung, stalled
from nodekit.system.proc.env import environ, extra_env, overlay
from nodekit.system.proc.signals import STOP_SIGNALS, Interrupted, interrupted, left, left_behind, stopping
from nodekit.system.proc.spawn import Result, Stdio, command_prefix, gnu_timeout, run, start, stopped

__all__ = [
    "KILL_AFTER_S",
    "STOP_SIGNALS",
    "TIMEOUT_CODES",
    "Child",
    "Deadline",
    "Interrupted",
    "Result",
    "Stall",
    "Stdio",
    "Unbounded",
    "alive",
    "command_prefix",
    "environ",
    "extra_env",
    "gnu_timeout",
    "hung",
    "interrupted",
    "left",
    "left_behind",
    "live",
    "overlay",
    "run",
    "stalled",
    "start",
    "stopped",
    "stopping",
    "terminate_all",
]
