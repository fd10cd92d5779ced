"""The doctor's checks, pure: :class:`DoctorFacts` in, PASS / WARN / FAIL / SKIP rows out.

:func:`rows` is every check in the order a user fixes things: the Docker engine, GPUs, the network (in
:mod:`nodekit.doctor.network`), limits, the image. Each WARN and FAIL carries the exact command that fixes it.
Nothing here runs a command, opens a socket or reads the environment; tests feed it facts.
"""

from __future__ import annotations

import re

from nodekit.doctor.model import CheckRow, DoctorFacts, EngineCheck, Status
from nodekit.doctor.network import firewall_row, network_rows, port_range_row
from nodekit.errors import UsageError
from nodekit.job.container import ulimits
from nodekit.job.spec import infiniband_for

MIB = 1024 * 1024
GIB = 1024 * MIB
STACK_WANTED = 64 * MIB
SHM_WANTED = 1 * GIB
# Docker 25+ gives containers a soft limit of 1024 open files: DataLoader workers that share tensors through file
# descriptors run out ("Too many open files").
NOFILE_WANTED = 8192

TOOLKIT_FIX = (
    "sudo apt-get install -y nvidia-container-toolkit && sudo nvidia-ctk runtime configure --runtime=docker "
    "&& sudo systemctl restart docker"
)
DAEMON_LIMIT_FIX = (
    "sudo mkdir -p /etc/systemd/system/docker.service.d && printf '[Service]\\nLimit{key}=infinity\\n' | "
    "sudo tee /etc/systemd/system/docker.service.d/nodekit-{name}.conf && sudo systemctl daemon-reload && "
    "sudo systemctl restart docker"
)


def rows(f: DoctorFacts) -> list[CheckRow]:
    """Every check's row, in the order a user fixes things: engine, GPUs, network, limits, image."""
    out = [*_engine_rows(f.engine), *_gpu_rows(f), *network_rows(f)]
    out += [port_range_row(f), firewall_row(f), _infiniband_row(f), _shm_row(f), _ulimits_row(f), _image_row(f)]
    return out


def _engine_rows(e: EngineCheck) -> list[CheckRow]:
    if e.failed == "engine":
        skip = "not checked: no Docker engine"
        return [
            CheckRow("docker engine", Status.FAIL, e.error or "no engine", e.fix),
            CheckRow("compose v2", Status.SKIP, skip),
            CheckRow("buildx", Status.SKIP, skip),
        ]
    rows_ = [CheckRow("docker engine", Status.PASS, f"Docker {e.server or '?'}")]
    if e.failed == "compose":
        return [
            *rows_,
            CheckRow("compose v2", Status.FAIL, e.error or "", e.fix),
            CheckRow("buildx", Status.SKIP, "not checked"),
        ]
    compose = _version(e.compose)
    if compose.split(".")[0].isdigit() and int(compose.split(".")[0]) < 2:
        rows_.append(CheckRow("compose v2", Status.FAIL, f"Compose {compose} is v1", "make engine"))
    else:
        rows_.append(CheckRow("compose v2", Status.PASS, f"Compose {compose}"))
    if e.failed == "buildx":
        return [*rows_, CheckRow("buildx", Status.FAIL, e.error or "", e.fix)]
    return [*rows_, CheckRow("buildx", Status.PASS, f"Buildx {_version(e.buildx)}")]


def _version(text: str | None) -> str:
    """The first version number in a tool's version line ("Docker Compose version v2.26.1" -> "2.26.1")."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text or "")
    return m.group(1) if m else (text or "?")


def _gpu_rows(f: DoctorFacts) -> list[CheckRow]:
    n = f.host.gpu_count
    if n == 0:
        return [
            CheckRow(
                "gpus",
                Status.SKIP,
                "no NVIDIA GPU on this node (CPU-only): GPU checks skipped; jobs use gloo, nproc_per_node auto = 1",
            )
        ]
    models = sorted(set(f.host.gpu_models))
    host_row = CheckRow("gpus", Status.PASS, f"{n} x {', '.join(models) or 'NVIDIA GPU'}")
    c = f.containers
    if c.gpu_error is not None:
        return [host_row, CheckRow("gpus in container", Status.FAIL, c.gpu_error, TOOLKIT_FIX)]
    if c.view is not None:
        seen = len(c.view.gpus)
        if seen == n:
            return [host_row, CheckRow("gpus in container", Status.PASS, f"{seen} visible in {c.view.image}")]
        return [
            host_row,
            CheckRow("gpus in container", Status.FAIL, f"{seen} of {n} GPUs visible inside a container", TOOLKIT_FIX),
        ]
    if not f.toolkit:
        return [
            host_row,
            CheckRow(
                "gpus in container",
                Status.FAIL,
                "NVIDIA container toolkit not installed: no GPU in containers",
                TOOLKIT_FIX,
            ),
        ]
    why = c.note or c.error or "no container could be started"
    return [host_row, CheckRow("gpus in container", Status.SKIP, f"not checked in a container: {why}")]


def _infiniband_row(f: DoctorFacts) -> CheckRow:
    devices = f.host.infiniband
    mode = f.settings.ib
    if mode == "on" and not devices:
        try:
            infiniband_for(f.settings, f.host, f.rank or 0)
        except UsageError as e:
            return CheckRow("infiniband", Status.FAIL, e.message, e.fix)
    if not devices:
        return CheckRow("infiniband", Status.PASS, "no /dev/infiniband: NCCL_IB_DISABLE=1, NCCL uses TCP sockets")
    if mode == "off":
        return CheckRow(
            "infiniband", Status.WARN, f'{len(devices)} RDMA devices, but ib = "off": NCCL uses TCP', 'ib = "auto"'
        )
    if f.host.memlock_hard is not None:
        return CheckRow(
            "infiniband",
            Status.FAIL,
            f"{len(devices)} RDMA devices, but memlock is capped at {f.host.memlock_hard // 1024} KiB: RDMA "
            "registration fails",
            DAEMON_LIMIT_FIX.format(key="MEMLOCK", name="memlock"),
        )
    return CheckRow("infiniband", Status.PASS, f"{len(devices)} RDMA devices passed with IPC_LOCK, memlock unlimited")


def _shm_row(f: DoctorFacts) -> CheckRow:
    view = f.containers.view
    shm = view.shm if view and view.shm else f.host_shm
    if shm is None:
        return CheckRow("shared memory", Status.SKIP, "cannot read /dev/shm")
    where = "in the container (ipc: host)" if view and view.shm else "on the host (ipc: host shares it)"
    if shm < SHM_WANTED:
        return CheckRow(
            "shared memory",
            Status.WARN,
            f"/dev/shm is {_size(shm)} {where}: DataLoader workers and NCCL need more",
            "sudo mount -o remount,size=16G /dev/shm",
        )
    return CheckRow("shared memory", Status.PASS, f"/dev/shm {_size(shm)} {where}")


def _ulimits_row(f: DoctorFacts) -> CheckRow:
    c, error = f.containers.view, f.containers.error
    if c is None and error is not None:
        # runc names the limit it could not set by number: RLIMIT_STACK 3, RLIMIT_NOFILE 7, RLIMIT_MEMLOCK 8.
        which = re.search(r"rlimit type (\d+)", error)
        key = {"3": "STACK", "7": "NOFILE", "8": "MEMLOCK"}.get(which.group(1)) if which else None
        fix = DAEMON_LIMIT_FIX.format(key=key, name=key.lower()) if key else None
        return CheckRow("ulimits", Status.FAIL, f"the job's container cannot start: {error}", fix)
    if c is not None:
        memlock, stack, nofile, src = c.memlock, c.stack, c.nofile, f"in a container of {c.image}"
    else:
        asked = {u.name: u for u in ulimits(f.host)}
        memlock = None if "memlock" in asked else f.host.memlock_hard
        stack = asked["stack"].soft
        nofile = f.host_nofile
        src = f"predicted from the host ({f.containers.note or 'no container run'})"
    detail = f"memlock {_limit(memlock)}, stack {_limit(stack)}, nofile {nofile if nofile else 'unlimited'} {src}"
    if stack is not None and stack < STACK_WANTED:
        return CheckRow(
            "ulimits", Status.WARN, f"{detail}: stack below 64 MiB", DAEMON_LIMIT_FIX.format(key="STACK", name="stack")
        )
    if nofile is not None and nofile < NOFILE_WANTED:
        return CheckRow(
            "ulimits",
            Status.WARN,
            f"{detail}: nofile below {NOFILE_WANTED} (DataLoader workers run out of descriptors)",
            DAEMON_LIMIT_FIX.format(key="NOFILE", name="nofile"),
        )
    return CheckRow("ulimits", Status.PASS, detail)


def _image_row(f: DoctorFacts) -> CheckRow:
    img = f.image
    if img.error is not None:
        return CheckRow("image", Status.WARN, img.error, img.fix or "nodekit build")
    if not img.present or img.ref is None:
        return CheckRow("image", Status.WARN, f"{img.ref or 'the image'} is not on this engine", "nodekit build")
    tag = img.ref.rsplit(":", 1)[-1]
    if img.fingerprint is None:
        return CheckRow("image", Status.WARN, f"{img.ref} has no nodekit fingerprint label", "nodekit build")
    if not img.fingerprint.startswith(tag):
        return CheckRow("image", Status.WARN, f"{img.ref} carries fingerprint {img.fingerprint[:12]}", "nodekit build")
    return CheckRow(
        "image", Status.PASS, f"{img.ref}, fingerprint {img.fingerprint[:12]} (nodekit build is a no-op if current)"
    )


def _limit(n: int | None) -> str:
    return "unlimited" if n is None else _size(n)


def _size(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n // 1024} KiB"
