"""A real Slurm on the virtual cluster: one ``munged``, one ``slurmctld`` and one ``slurmd`` per host.

Layout (cluster ``nkt``, hosts h0 and h1)::

    /run/nodekit-cluster/nkt/slurm/      everything of this Slurm: key, config, hosts file, spool, pids, logs
    munged      in h0's network namespace; its socket is a path, so every namespace reaches it
    slurmctld   in h0's network namespace, hostname ``ctl`` (its own UTS namespace), port 6817 on h0's address
    slurmd      one per host, in that host's network namespace with its own hostname (h0, h1, ...: the NodeName),
                its own /etc/hosts (every node name -> its address, the controller too) and that host's Docker
                engine bind-mounted at /run/docker.sock (its own mount namespace): a job step on a node reaches
                that node's engine the way it would on a real machine, through the default socket
    clients     sbatch, srun, squeue, scontrol, scancel: run in h0's namespace with SLURM_CONF (``Slurm.env``)

Every daemon runs in a host's network namespace, so ``Cluster.down`` (and ``Host.stop`` for one host) ends them
with everything else there; ``Slurm.down`` stops them by PID first, so a test can check that nothing is left.
``SlurmdParameters=config_overrides`` lets each slurmd run with the node sizes we declare (testing only),
``ProctrackType=proctrack/pgid`` and ``TaskPlugin=task/none`` need no cgroup setup, and the spool, pid and log paths
carry ``%n`` (the node name) so that the daemons of several nodes on one machine never share a file.

Needs Debian's slurm-wlm and munge (``bash scripts/slurm.sh``), unshare and nsenter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.harness import Cluster, HarnessError, Host, _alive, _tail

TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "unshare")
CONTROLLER = "ctl"
PARTITION = "debug"
CTLD_PORT = 6817
SLURMD_PORT = 6818


def problem() -> str | None:
    """Why no Slurm can run here, or None."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} missing (bash scripts/slurm.sh installs Debian's slurm-wlm and munge)"
    return None


def slurm_conf(name: str, d: Path, ctl: Host, nodes: Sequence[Host], *, cpus: int = 2) -> str:
    """The cluster's slurm.conf: the controller on ``ctl``'s address, one node per host, one partition."""
    lines = [
        f"ClusterName={name}",
        f"SlurmctldHost={CONTROLLER}({ctl.addr})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge.socket'}",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        f"StateSaveLocation={d / 'ctld'}",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        # %n: one spool, pid file and log per node, though every slurmd runs on this one machine.
        f"SlurmdSpoolDir={d / 'spool' / '%n'}",
        f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
        f"SlurmdLogFile={d / 'slurmd-%n.log'}",
        f"PlugStackConfig={d / 'plugstack.conf'}",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        # A node whose slurmd is gone is declared down after this long (a lost host ends its job's step).
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=30",
        "MinJobAge=600",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    lines += [f"NodeName={h.name} NodeAddr={h.addr} CPUs={cpus} RealMemory=2000 State=UNKNOWN" for h in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def hosts_file(ctl: Host, nodes: Sequence[Host]) -> str:
    """/etc/hosts for every daemon: node names and the controller's name at their cluster addresses."""
    rows = ["127.0.0.1 localhost", f"{ctl.addr} {CONTROLLER}", *(f"{h.addr} {h.name}" for h in nodes)]
    return "\n".join(rows) + "\n"


@dataclass
class Slurm:
    """Slurm on ``cluster``: the controller (and munged) on host 0, a slurmd on every host."""

    cluster: Cluster
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.cluster.run_dir / self.cluster.name / "slurm"

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def ctl(self) -> Host:
        return self.cluster.main

    @property
    def env(self) -> dict[str, str]:
        """What a client (and the jobs it submits) needs: this cluster's slurm.conf."""
        return {"SLURM_CONF": str(self.conf)}

    def up(self, *, timeout: float = 60) -> Slurm:
        why = problem()
        if why:
            raise HarnessError(why)
        d = self.dir
        (d / "ctld").mkdir(parents=True, exist_ok=True)
        (d / "spool").mkdir(exist_ok=True)
        for h in self.cluster.hosts:
            (d / "spool" / h.name).mkdir(exist_ok=True)
        (d / "plugstack.conf").write_text("")
        (d / "hosts").write_text(hosts_file(self.ctl, self.cluster.hosts))
        self.conf.write_text(slurm_conf(self.cluster.name, d, self.ctl, self.cluster.hosts))
        try:
            self._start_munged()
            self._start(
                "slurmctld", self.ctl, CONTROLLER, ["slurmctld", "-D", "-i", "-f", str(self.conf)], docker=False
            )
            for h in self.cluster.hosts:
                self._start(f"slurmd-{h.name}", h, h.name, ["slurmd", "-D", "-f", str(self.conf)], docker=True)
            self.wait_idle([h.name for h in self.cluster.hosts], timeout=timeout)
        except BaseException:
            self.down()
            raise
        return self

    def _start_munged(self) -> None:
        d = self.dir
        key = d / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o400)
        argv = self.ctl.argv(
            "munged", "--foreground", "--force", f"--socket={d / 'munge.socket'}", f"--key-file={key}",
            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}",
        )  # fmt: skip
        self.pids["munged"] = _spawn(argv, d / "munged.out")
        _wait_for(lambda: (d / "munge.socket").exists(), 10, "munged", d / "munged.log", self.pids["munged"])

    def _start(
        self, what: str, host: Host, hostname: str, cmd: list[str], *, docker: bool, hide: Sequence[str] = ()
    ) -> None:
        """``cmd`` in ``host``'s network namespace, with its own hostname and /etc/hosts (and, for a node, the
        host's engine at the default Docker socket): ``unshare`` execs the shell, which execs the daemon.
        ``hide``: programs this node does not have (/dev/null mounted over them, so they are not executable)."""
        d = self.dir
        binds = [f"mount --bind {d / 'hosts'} /etc/hosts"]
        if docker:
            binds.append(f"mount --bind {host.sock} /run/docker.sock")
        binds += [f"mount --bind /dev/null {path}" for path in hide]
        script = f"hostname {hostname} && {' && '.join(binds)} && exec {' '.join(cmd)}"
        argv = host.argv("unshare", "--uts", "--mount", "sh", "-c", script)
        self.pids[what] = _spawn(argv, d / f"{what}.out")

    def restart_node(self, host: Host, *, hide: Sequence[str] = ()) -> None:
        """Start ``host``'s slurmd again (stopped by PID first), e.g. as a node that lacks the programs ``hide``."""
        what = f"slurmd-{host.name}"
        _stop([self.pids.pop(what)], timeout=15)
        self._start(what, host, host.name, ["slurmd", "-D", "-f", str(self.conf)], docker=True, hide=hide)
        self.wait_idle([host.name])

    def wait_idle(self, nodes: Sequence[str], *, timeout: float = 60) -> None:
        """Until every node in ``nodes`` is idle (registered, no job on it)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for what, pid in self.pids.items():
                if not _alive(pid):
                    log = self.dir / f"{what}.out"
                    raise HarnessError(f"{what} exited at start; see {log}:\n{_tail(log)}")
            proc = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
            last = proc.stdout + proc.stderr
            states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in nodes):
                return
            time.sleep(0.3)
        raise HarnessError(f"Slurm nodes {list(nodes)} not idle after {timeout:.0f} s: {last.strip()}")

    def run(
        self, *cmd: str, timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client on the controller's host (sbatch, squeue, scontrol, ...)."""
        return self.ctl.run(*cmd, env={**self.env, **(env or {})}, timeout=timeout)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, NodeList, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def step_pids(self, host: Host) -> list[int]:
        """PIDs of slurmstepd processes on ``host`` (a job step still running there)."""
        from tests.cluster.harness import netns_inode, pids_in_netns

        inode = netns_inode(host.netns_path)
        found = []
        for pid in pids_in_netns(inode) if inode else []:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmstepd":
                    found.append(pid)
        return found

    def down(self, *, timeout: float = 15) -> None:
        """Stop every daemon by PID (SIGTERM, then SIGKILL at the deadline). The files go with the cluster."""
        _stop(list(self.pids.values()), timeout=timeout)
        self.pids.clear()


def _stop(pids: list[int], *, timeout: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _spawn(argv: list[str], out: Path) -> int:
    with open(out, "a") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def _wait_for(ok: object, timeout: float, what: str, log: Path, pid: int) -> None:
    deadline = time.monotonic() + timeout
    while not ok():  # type: ignore[operator]
        if not _alive(pid):
            raise HarnessError(f"{what} exited at start; see {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise HarnessError(f"{what} not ready after {timeout:.0f} s; see {log}")
        time.sleep(0.05)
