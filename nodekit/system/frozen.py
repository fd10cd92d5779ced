"""The one model configuration of every value nodekit plans with: immutable once made, and no field it does not
declare (a misspelt key is an error, not a silently ignored extra)."""

from pydantic import ConfigDict

FROZEN = ConfigDict(frozen=True, extra="forbid")
