"""benchmarks/start_cost.py: each sample's process is charged to what it is for, from the process table."""

from __future__ import annotations

from benchmarks.start_cost import Procs, charge, kind, lumped

# pid: (parent, name, command line), as the poller records them: one host's engine with a nodekit container
# (compose's init, the launcher, a worker), bare torchrun's container (its agent first), the head and its ssh.
PROCS: Procs = {
    10: (1, "dockerd", "dockerd"),
    11: (10, "containerd", "containerd"),
    20: (1, "containerd-shim", "containerd-shim-runc-v2 -id a"),
    21: (20, "docker-init", "/sbin/docker-init -- python -m nodekit.launcher"),
    22: (21, "python", "/opt/venv/bin/python -m nodekit.launcher train.py"),
    23: (22, "python", "/opt/venv/bin/python -u train.py"),
    30: (1, "containerd-shim", "containerd-shim-runc-v2 -id b"),
    31: (30, "python", "/opt/venv/bin/python -m torch.distributed.run train.py"),
    32: (31, "python", "/opt/venv/bin/python -u train.py"),
    40: (1, "python", "python -m nodekit run --image x"),
    41: (40, "ssh", "ssh -o ControlMaster=auto root@10.0.0.2 true"),
    42: (1, "ssh", "ssh: /run/nkssh.40.x/c [mux]"),
    50: (1, "sshd", "sshd: /usr/sbin/sshd"),
    51: (50, "sshd", "sshd: root@notty"),
    52: (51, "docker", "docker compose up -d"),
    53: (51, "bash", "bash -c true"),
    60: (2, "kworker/0:1", ""),
}


def test_each_process_is_charged_to_what_it_is_for() -> None:
    def k(pid: int, comm: str | None = None) -> str:
        return kind(pid, comm or PROCS[pid][1], PROCS, head=40, bench=99)

    assert k(10) == "engine: dockerd" and k(20) == "engine: shim" and k(21) == "engine: docker-init"
    assert k(22) == "container: first process (python)"  # under compose's init: still the first process
    assert k(22, "pt_elastic") == "container: first process (pt_elastic)"  # a thread of it, by its own name
    assert k(23) == "container: workers" and k(32) == "container: workers"
    assert k(31) == "container: first process (python)"  # bare torchrun's agent, the container's first
    assert k(23, "runc:[2:INIT]") == "engine: runc"
    assert k(40) == "head: nodekit run" and k(41) == "head: ssh" and k(42) == "head: ssh"
    assert k(52) == "hosts: docker CLI" and k(53) == "hosts: sshd and shells"
    assert k(60) == "other: kworker/0:1" and kind(99, "python", PROCS, 40, 99) == "this benchmark (its poller)"
    assert kind(41, "ssh", PROCS, head=0, bench=99) == "head: ssh"  # bare's side has no nodekit run


def test_only_the_samples_to_the_first_step_count_and_small_kinds_are_lumped() -> None:
    samples = [(1.0, 23, "python")] * 500 + [(5.0, 23, "python")] * 300 + [(1.5, 60, "kworker/0:1")] * 50
    got = charge(samples, PROCS, 40, t0=0.5, t1=4.0)
    assert got == {"container: workers": 0.5, "other: kworker/0:1": 0.05}
    assert lumped(got) == {"container: workers": 0.5, "other: the rest": 0.05}
