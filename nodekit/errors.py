"""The error tree. The CLI maps each type to an exit code and prints ``message`` and ``fix`` on one line each.

Every error says what went wrong, where (``node``, when known), and the command that fixes it.
"""

from __future__ import annotations


class NodekitError(Exception):
    """Base of every error nodekit reports to a user."""

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None, node: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.node = node

    def one_line(self) -> str:
        where = f"[{self.node}] " if self.node else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{where}{self.message.rstrip('.')}.{fix}"


class UsageError(NodekitError):
    """Bad input: configuration, flags, a missing file. Nothing was changed."""

    exit_code = 2


class ConfigError(UsageError):
    """nodekit.toml, NODEKIT_* variables or flags do not validate."""


class EngineError(NodekitError):
    """No Docker engine, or one without the Compose v2 / Buildx plugins."""

    exit_code = 2


class ImageError(NodekitError):
    """The image is missing, differs from what was expected, or cannot be built."""

    exit_code = 2


class BuildError(NodekitError):
    """The image build itself failed (the Docker output says why)."""

    exit_code = 1


class NetworkError(NodekitError):
    """A node cannot reach main, a port is closed or already in use."""

    exit_code = 2


class ShipError(NodekitError):
    """Moving an image to another node failed; the target node's images are untouched."""

    exit_code = 1


class JobFailed(NodekitError):
    """The training job ran and exited non-zero; ``exit_code`` is the job's."""

    def __init__(self, message: str, *, exit_code: int, node: str | None = None, fix: str | None = None) -> None:
        super().__init__(message, fix=fix, node=node)
        self.exit_code = exit_code


class DeadlineError(NodekitError):
    """A call that can hang (a subprocess, an engine call, a peer) did not finish within its deadline; the message
    names what hung and for how long."""

    exit_code = 1


class HostToolHung(DeadlineError):
    """A tool of this host's own (nvidia-smi) did not answer within its deadline: the host is not ready and nothing
    was started, so the exit code is that of the other not-ready errors."""

    exit_code = 2
