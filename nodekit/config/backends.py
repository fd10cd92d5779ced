"""Where a planned job can run: one registration per backend, the one place a new backend is named outside its own
folder (``nodekit/backends/<name>/``) and its CLI module (``nodekit/cli/<topic>.py``), in the spirit of torchx's
``get_scheduler_factories``.

Derived from :data:`BACKENDS`, never kept by hand: the CLI's topic modules and their order in ``--help``
(``nodekit.cli.common.TOPICS``, imported by ``nodekit.cli.app``), the nodekit.toml tables (:class:`BackendTables`,
which ``Settings`` extends; the reference page is generated from the settings model), how an error names a key of a
backend's table (``[slurm] time``: ``nodekit.config.file.shown_key``), and the commands whose runs are recorded
(``nodekit.runs.model.Command``). ``tests/unit/config/test_backends.py`` adds a throwaway backend to a copy of the
package touching only its folder, its CLI module and this file.

This module sits on the configuration floor so that every floor above (runs, backends, cli) may read it; it names
the CLI modules and backend folders only as text.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from nodekit.config.tables import K8sSettings, SlurmSettings


@dataclass(frozen=True)
class Backend:
    """One backend: ``name`` is its folder under ``nodekit/backends/`` and the ``backend`` of the plans it returns
    (``nodekit.backends.shape.BackendPlan``); ``topic`` its CLI module under ``nodekit/cli/``; ``commands`` the
    commands there that plan a job and print that plan on ``--dry-run``; ``records`` those of them whose runs go to
    ``.nodekit/runs``; ``table`` its nodekit.toml table, a field of :class:`BackendTables` (None: it has none)."""

    name: str
    topic: str
    commands: tuple[str, ...]
    records: tuple[str, ...] = ()
    table: str | None = None


BACKENDS: tuple[Backend, ...] = (
    Backend("compose", topic="nodes", commands=("compose", "up"), records=("up",)),
    Backend("fleet", topic="fleet", commands=("run",), records=("run",)),
    Backend("slurm", topic="slurm", commands=("slurm",), records=("slurm",), table="slurm"),
    Backend("k8s", topic="k8s", commands=("k8s",), table="k8s"),
)


class BackendTables(BaseModel):
    """The backends' nodekit.toml tables, one field each (its name is a registration's ``table``)."""

    slurm: SlurmSettings = Field(default_factory=SlurmSettings, description="nodekit slurm ([slurm])")
    k8s: K8sSettings = Field(default_factory=K8sSettings, description="nodekit k8s: the Kubernetes manifests ([k8s])")


def backend(name: str) -> Backend:
    """The registration called ``name`` (KeyError for none)."""
    found = {b.name: b for b in BACKENDS}
    return found[name]


def topics() -> tuple[str, ...]:
    """The backends' CLI modules, in registration order (each once)."""
    return tuple(dict.fromkeys(b.topic for b in BACKENDS))


def tables() -> tuple[str, ...]:
    """The backends' nodekit.toml tables."""
    return tuple(b.table for b in BACKENDS if b.table is not None)


def recorded() -> tuple[str, ...]:
    """The commands whose runs are recorded in ``.nodekit/runs``."""
    return tuple(c for b in BACKENDS for c in b.records)
