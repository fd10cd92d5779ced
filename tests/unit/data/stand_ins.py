"""What the data unit tests stand in for: a host's SSH address, as ``nodekit.data.transport.Where`` holds it (the
endpoint's parsed fields), without parsing a hosts line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ssh:
    name: str
    scheme: str = "ssh"
    hostname: str = "10.0.0.1"
    user: str | None = "root"
    port: int | None = None
