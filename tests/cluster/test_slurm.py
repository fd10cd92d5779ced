"""nodekit slurm on a real Slurm: munged, slurmctld and a slurmd per virtual host (tests/cluster/slurm.py).

Every test submits from host 0 (the login node: its engine has the image, the Slurm client talks to slurmctld there)
with ``nodekit slurm --submit``, as a user would; the job's tasks run on the hosts' slurmds, each reaching its own
host's Docker engine, and the project directory is shared by every host (one file system), as a cluster's home or
scratch is.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import snoop
from tests.cluster.harness import Cluster, Host, netns_inode, pids_in_netns
from tests.cluster.helpers import CLOSED_OR_CUT, Demo, host_project, nodekit_argv, push_image, tampered_image
from tests.cluster.helpers import finish as run_finished
from tests.cluster.slurm import Slurm
from tests.cluster.slurm import problem as slurm_problem
from tests.conftest import cluster_name, unavailable

pytestmark = [pytest.mark.cluster, pytest.mark.docker]

EXIT_STACK_MISMATCH = 17
EXIT_PEER_LOST = 19
PEER_TIMEOUT = 15
JOB_S = 300  # a 2-node job of the demo takes about 20 s here; the conversion, when not cached, minutes
# Converted images outlive the session, as the hosts' image stores do: the cache is keyed by image id.
IMAGE_CACHE = Path("/var/lib/nodekit-cluster/slurm-images")
LONG = json.dumps(["--epochs", "100000", "--pg-timeout", "600"])


@pytest.fixture(scope="session")
def slurm_ready(cluster_ready: None) -> None:
    why = slurm_problem()
    if why is not None:
        unavailable("Slurm tests", why)


@pytest.fixture
def slurm(slurm_ready: None, demo_on_main: Demo, request: pytest.FixtureRequest) -> Iterator[Slurm]:
    """Two fresh hosts (NAME-h0, NAME-h1, the group's cluster name) with munged, slurmctld (on h0) and a slurmd on
    each; stopped by PID and torn down after the test. (After demo_on_main, which briefly uses the same cluster name
    to load the image.)"""
    c = Cluster(2, name=cluster_name(request.node.nodeid), owner=os.getpid())
    c.up()
    s = Slurm(c)
    try:
        s.up()
        yield s
    finally:
        s.down()
        c.down()


@pytest.fixture
def demo_both(slurm: Slurm, demo_on_main: Demo) -> Demo:
    """The demo image on both hosts (pushed from host 0 where missing)."""
    push_image(demo_on_main.ref, slurm.ctl.docker_host, slurm.cluster.hosts[1:])
    return demo_on_main


def project(demo: Demo, slurm: Slurm, base: Path, **settings: object) -> Path:
    """The demo project on the shared file system, with ``[slurm]`` settings."""
    dest = host_project(demo, slurm.ctl, base)
    table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
    (dest / "nodekit.toml").write_text((dest / "nodekit.toml").read_text() + "\n[slurm]\n" + table)
    return dest


def start(
    slurm: Slurm, proj: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """``nodekit slurm --submit`` on the login node (host 0), its output to a log."""
    log = proj.parent / f"nodekit-slurm-{time.monotonic_ns()}.log"
    argv = nodekit_argv("slurm", "--submit", "--config", str(proj / "nodekit.toml"), *args)
    return slurm.ctl.popen(*argv, env={**slurm.env, **(env or {})}, cwd=proj, log=log), log


def finish(proc: subprocess.Popen[str], log: Path, timeout: float = JOB_S) -> tuple[int, str]:
    return run_finished(proc, log, timeout, what="nodekit slurm")


def wait_for(log: Path, pattern: str, proc: subprocess.Popen[str], slurm: Slurm, timeout: float = JOB_S) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, log.read_text(errors="replace")):
        assert proc.poll() is None, f"ended before {pattern!r}:\n{log.read_text()[-4000:]}"
        if time.monotonic() > deadline:
            raise AssertionError(f"no {pattern!r} after {timeout:.0f} s:\n{log.read_text()[-4000:]}\n{diagnose(slurm)}")
        time.sleep(0.3)


def diagnose(slurm: Slurm) -> str:
    """What runs where: the job's steps, each host's containers and processes (for a failure message)."""
    parts = [slurm.run("squeue", "-s").stdout]
    for h in slurm.cluster.hosts:
        parts.append(f"--- {h.name}: " + h.docker("ps", "-a", check=False).stdout)
        inode = netns_inode(h.netns_path)
        for pid in pids_in_netns(inode) if inode else []:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            except OSError:
                continue
            parts.append(f"{pid} {cmdline}")
    return "\n".join(parts)


def nothing_left(slurm: Slurm, hosts: list[Host] | None = None) -> None:
    """No container of any Slurm job, no job step, no ch-run on any (live) host; no job in the queue."""
    for h in hosts or slurm.cluster.hosts:
        assert h.docker("ps", "-aq", "--filter", "label=org.nodekit.slurm-job").stdout.split() == [], h.name
        assert slurm.step_pids(h) == [], f"job steps left on {h.name}"
        assert _processes(h, "ch-run") == [], f"ch-run left on {h.name}"
    assert slurm.run("squeue", "-h").stdout.strip() == ""


def _processes(host: Host, comm: str) -> list[int]:
    inode = netns_inode(host.netns_path)
    found = []
    for pid in pids_in_netns(inode) if inode else []:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                found.append(pid)
        except OSError:
            pass
    return found


def checksums_equal(proj: Path, out: str) -> dict[str, object]:
    result = json.loads((proj / "outputs" / "result.json").read_text())
    assert result["world_size"] == 2 and len(result["checksums"]) == 2, out
    assert result["checksums_equal"] is True and len(set(result["checksums"])) == 1, result
    return result  # type: ignore[no-any-return]


def no_secret_seen(slurm: Slurm, proj: Path) -> None:
    """While the job runs: no process's arguments, and no file another user can read, hold the job secret, as an
    unprivileged local user sees them (every virtual host shares this machine's process table and files)."""
    value = (proj / ".nodekit" / "job-secret").read_text().strip()
    script = proj / "compose" / "slurm.sbatch"
    assert value in script.read_text() and script.stat().st_mode & 0o077 == 0  # the job's secret, in a 0600 file
    assert snoop.processes_showing(value) == []
    # Slurm's own copies of the script and the job's files (state, spools, logs; the project is under pytest's 0700
    # directory, its files' modes are checked above).
    seen, found = snoop.readable_files_holding(value, [slurm.dir])
    assert seen > 0 and found == []


@pytest.mark.smoke
def test_docker_mode_runs_the_demo_on_two_slurm_nodes(
    slurm: Slurm, demo_both: Demo, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """Also: the project's path holds a space and a "#" (sbatch splits #SBATCH lines there unless quoted), and
    while the job runs no other user sees the job secret (issue 28)."""
    h0, h1 = slurm.cluster.hosts
    base = tmp_path / "my proj#2"
    proj = project(demo_both, slurm, base, container="docker", push_to=[h.docker_host for h in (h0, h1)])
    t0 = time.monotonic()
    proc, log = start(slurm, proj)
    wait_for(log, r"1: nodekit ddp-demo: node 1/2", proc, slurm)
    no_secret_seen(slurm, proj)
    code, out = finish(proc, log)
    record_property("docker_job_seconds", round(time.monotonic() - t0, 1))
    assert code == 0, out
    checksums_equal(proj, out)
    assert "is already on every push_to engine" in out or "is on every push_to engine" in out, out
    # Each node resolved its own interface toward main (net0 on h0, eth1 on h1), past the decoy default route.
    assert (
        "0: nodekit ddp-demo: node 0/2" in out and f"| iface {h0.iface} |" in out and f"| iface {h1.iface} |" in out
    ), out
    assert "nodekit-slurm: every node finished (exit code 0)" in out
    assert (proj / "compose" / "slurm.sbatch").is_file()
    assert list((proj / "outputs").glob("slurm-*.out")), "the log is not where --output put it"
    nothing_left(slurm)


def image_cache(demo: Demo) -> str:
    """The SquashFS cache, holding only the current demo image's files (older image ids' are removed)."""
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    short = demo.image_id.removeprefix("sha256:")[:16]
    for old in IMAGE_CACHE.iterdir():
        if short not in old.name:
            old.unlink() if old.is_file() else shutil.rmtree(old, ignore_errors=True)
    return str(IMAGE_CACHE)


def test_charliecloud_mode_runs_the_demo_on_two_slurm_nodes(
    slurm: Slurm, demo_on_main: Demo, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    proj = project(demo_on_main, slurm, tmp_path, container="charliecloud", image_dir=image_cache(demo_on_main))
    t0 = time.monotonic()
    proc, log = start(slurm, proj)
    wait_for(log, r"1: nodekit ddp-demo: node 1/2", proc, slurm, timeout=JOB_S + 900)
    no_secret_seen(slurm, proj)
    code, out = finish(proc, log, timeout=JOB_S + 900)
    record_property("charliecloud_job_seconds", round(time.monotonic() - t0, 1))
    made = re.search(r"\.sqsh made in (\d+) s", out)
    if made:
        record_property("squashfs_seconds", int(made.group(1)))
        print(f"SquashFS of {demo_on_main.ref} made in {made.group(1)} s")
    assert code == 0, out
    assert [p.name for p in IMAGE_CACHE.iterdir() if p.name.startswith(".")] == [], "conversion leftovers"
    checksums_equal(proj, out)
    assert "0: nodekit ddp-demo: node 0/2" in out and "1: nodekit ddp-demo: node 1/2" in out, out
    nothing_left(slurm)


def test_a_different_image_on_one_node_is_refused_naming_it(slurm: Slurm, demo_both: Demo, tmp_path: Path) -> None:
    """The stack proof compares every node: node 1's engine holds another image under the same tag."""
    h1 = slurm.cluster.hosts[1]
    other = tampered_image(h1, demo_both.ref)
    h1.docker("tag", other, demo_both.ref)
    try:
        code, out = finish(*start(slurm, project(demo_both, slurm, tmp_path, container="docker")))
    finally:
        h1.docker("tag", demo_both.image_id, demo_both.ref)
        h1.docker("rmi", other, check=False)
    assert code == EXIT_STACK_MISMATCH, out
    assert "stack mismatch" in out and "f" * 12 in out, out  # the differing fingerprint, in the table
    assert re.search(r"the job failed with exit code 17: node \d \(h\d\) failed first", out), out
    assert f"exit code {EXIT_STACK_MISMATCH}" in out.splitlines()[-1], out
    assert not (tmp_path / "h0" / "ddp" / "outputs" / "result.json").exists()
    nothing_left(slurm)


def test_a_node_lost_mid_job_is_named(
    slurm: Slurm, demo_both: Demo, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """Host 1 dies with its slurmd, its job step and its containers: node 0's watchdog names it (at once when the
    kernel closed its store connection, within NODEKIT_PEER_TIMEOUT otherwise) and the job ends with 19, the code
    nodekit slurm exits with."""
    h0, h1 = slurm.cluster.hosts
    proc, log = start(slurm, project(demo_both, slurm, tmp_path, container="docker"), env={"NODEKIT_ARGS": LONG})
    wait_for(log, r"0: ddp-demo: first step done", proc, slurm)
    killed = time.monotonic()
    h1.stop()
    code, out = finish(proc, log, timeout=PEER_TIMEOUT + 120)
    seconds = time.monotonic() - killed
    record_property("lost_node_exit_seconds", round(seconds, 1))
    print(f"nodekit slurm ended {seconds:.1f} s after host 1 was killed")
    assert code == EXIT_PEER_LOST, out
    # Killed with its processes, the host's kernel closes or resets the store connection: named at once, or once the
    # heartbeat agrees; after the heartbeat's silence when neither got through. Main's own workers usually fail first
    # ("Connection reset by peer"): the lost node is still the cause named, and 19 the code.
    why = rf"(no heartbeat for \d+ s; |{CLOSED_OR_CUT})"
    assert re.search(rf"nodekit: node 1 \({re.escape(h1.addr)}, host [^)]*\) lost: {why}", out), out
    nothing_left(slurm, [h0])


def stubborn_image(host: Host, ref: str, script: str) -> str:
    """``ref`` plus /workspace/stubborn.py, on ``host``: a job that ignores SIGTERM."""
    name = f"{ref.rsplit(':', 1)[0]}:stubborn"
    cid = host.docker("create", ref).stdout.strip()
    try:
        src = Path(host.run_dir) / "stubborn.py"
        src.write_text(script)
        host.docker("cp", str(src), f"{cid}:/workspace/stubborn.py")
        host.docker("commit", cid, name)
    finally:
        host.docker("rm", "-f", cid, check=False)
    return name


STUBBORN = """import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("stubborn: ignoring SIGTERM", flush=True)
time.sleep(3600)
"""


def test_ctrl_c_cancels_and_a_container_that_ignores_sigterm_is_removed(
    slurm: Slurm, demo_both: Demo, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    """scancel kills the step's docker CLI; the container would keep running (it ignores SIGTERM). The task's trap
    stops and removes it: nothing is left on any host."""
    h0, h1 = slurm.cluster.hosts
    ref = stubborn_image(h0, demo_both.ref, STUBBORN)
    push_image(ref, h0.docker_host, [h1])  # the same image id on both: the stack proof compares it
    proj = project(demo_both, slurm, tmp_path, container="docker")
    (proj / "stubborn.py").write_text(STUBBORN)
    env = {"NODEKIT_SCRIPT": "stubborn.py", "NODEKIT_ARGS": "[]", "NODEKIT_LAUNCHER": "env"}
    try:
        proc, log = start(slurm, proj, "--image", ref, env=env)
        wait_for(log, r"0: stubborn: ignoring SIGTERM", proc, slurm, timeout=150)
        wait_for(log, r"1: stubborn: ignoring SIGTERM", proc, slurm)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc, log, timeout=120)
        record_property("cancel_seconds", round(time.monotonic() - stopped, 1))
        assert code == 130, out
        assert "scancel" in out, out
        nothing_left(slurm)
    finally:
        for h in slurm.cluster.hosts:
            h.docker("rmi", ref, check=False)


def test_sigterm_cancels_a_charliecloud_job_leaving_nothing(slurm: Slurm, demo_on_main: Demo, tmp_path: Path) -> None:
    proj = project(demo_on_main, slurm, tmp_path, container="charliecloud", image_dir=image_cache(demo_on_main))
    before = _temp_files()
    proc, log = start(slurm, proj, env={"NODEKIT_ARGS": LONG})
    wait_for(log, r"0: ddp-demo: first step done", proc, slurm, timeout=JOB_S + 900)
    assert all(_processes(h, "ch-run") for h in slurm.cluster.hosts)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, log, timeout=120)
    assert code == 143, out
    nothing_left(slurm)
    assert _temp_files() - before == set(), "ch-run left files behind"
    assert _task_dirs([_job_id(log)]) == [], "a task left its directory for ch-run"


def _temp_files() -> set[str]:
    """What ch-run, ch-convert or a job could leave in the machine's temporary directories (other engineers' tests
    share /tmp, so only these names count), ch-run's per-user default directory (<user>.ch) included, which a task
    must never make. A task's own directory for ch-run counts by its job's id (:func:`_task_dirs`): the unit tier,
    which others may run meanwhile, makes some too."""
    found = set()
    for d in (Path("/tmp"), Path("/var/tmp")):
        for p in d.iterdir():
            if p.name.startswith("nodekit-slurm-ch."):
                continue
            if p.name.endswith(".ch") or p.name.startswith(("ch-convert.", "nodekit-slurm")) or ".sqsh" in p.name:
                found.add(str(p))
    return found


def _task_dirs(job_ids: list[str]) -> list[Path]:
    """The directories the tasks of these jobs made for ch-run (mount point and image storage)."""
    return sorted(p for i in job_ids for p in Path("/var/tmp").glob(f"nodekit-slurm-ch.{i}.*"))


def _job_id(log: Path) -> str:
    found = re.search(r"submitted job (\d+)", log.read_text())
    assert found, log.read_text()
    return found.group(1)


def test_two_charliecloud_jobs_of_one_user_at_once_on_the_same_nodes(
    slurm: Slurm, demo_on_main: Demo, tmp_path: Path
) -> None:
    """Two jobs of one user released together onto the same two nodes: four ch-run of one user start on one machine
    (the virtual nodes share its /var/tmp), as on a GPU partition that shares nodes; ch-run's per-user defaults made
    them race ("can't mkdir: /var/tmp/root.ch: File exists", issue 44). Those defaults are also made first, as any
    other user of a node may: /var/tmp/$USER.ch/mnt a file (a ch-run that mounts there stops), and in that image
    storage a directory named like the image's path (a ch-run that looks there runs it instead of the SquashFS).
    Both jobs end 0, each task had its own directory, and none is left."""
    from nodekit.backends.slurm.submit import image_file
    from nodekit.config import settings

    cache = image_cache(demo_on_main)
    projs = []
    for i, port in enumerate((29500, 29600)):  # both mains are h0: one rendezvous port each
        # Held at submission, released together below: the tasks of both start at once.
        proj = project(
            demo_on_main, slurm, tmp_path / f"job{i}", container="charliecloud", image_dir=cache, sbatch_args=["--hold"]
        )
        toml = proj / "nodekit.toml"
        toml.write_text(f"master_port = {port}\n" + toml.read_text())
        projs.append(proj)
    sqsh = image_file(settings.load(projs[0] / "nodekit.toml"), demo_on_main.image_id, "charliecloud")
    user = os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name
    defaults = Path("/var/tmp") / f"{user}.ch"
    planted = defaults / "img" / str(sqsh).replace("/", "%").replace(":", "+")
    assert not defaults.exists() or _rm_our_leftover(defaults), f"{defaults} holds something: not ours to move"
    before = _temp_files()
    procs = []
    try:
        (planted / "bin").mkdir(parents=True)
        (planted / "PLANTED").write_text(_PLANTED)
        (defaults / "mnt").write_text(_NOT_A_DIRECTORY)
        ids = []
        for proj in projs:  # one after the other: the first converts the image when the cache lacks it
            proc, log = start(slurm, proj)
            procs.append((proc, log))
            wait_for(log, r"submitted job \d+", proc, slurm, timeout=JOB_S + 900)
            ids.append(_job_id(log))
        assert slurm.run("scontrol", "release", ",".join(ids)).returncode == 0
        most = 0
        deadline = time.monotonic() + JOB_S
        while any(proc.poll() is None for proc, _ in procs) and time.monotonic() < deadline:
            most = max(most, len(_task_dirs(ids)))
            time.sleep(0.1)
        results = [finish(proc, log) for proc, log in procs]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(defaults, ignore_errors=True)
    for code, out in results:
        assert code == 0, out
        assert "nodekit-slurm: every node finished (exit code 0)" in out, out
    for proj, (_, out) in zip(projs, results, strict=True):
        checksums_equal(proj, out)
    assert most == 4, f"at most {most} tasks' directories at once: the two jobs did not run together"
    nothing_left(slurm)
    assert _task_dirs(ids) == [] and _temp_files() - before == set()


_PLANTED = "not the image\n"
_NOT_A_DIRECTORY = "not a directory\n"


def _rm_our_leftover(defaults: Path) -> bool:
    """ch-run's default directory as a run of ours left it, removed: an older nodekit's empty mnt, or what the test
    above plants, left there when its run was killed before its ``finally`` (a session that ended mid-suite left it,
    and the next run on that machine failed here). False, and nothing touched, if it holds anything else."""
    found = {p.relative_to(defaults).as_posix(): p for p in defaults.rglob("*")}
    if found.keys() == {"mnt"} and found["mnt"].is_dir():
        found["mnt"].rmdir()
        defaults.rmdir()
        return True
    plant = {"mnt": _NOT_A_DIRECTORY, "img": None}
    for name in (k for k in found if re.fullmatch(r"img/%[^/]*\.sqsh", k)):  # the image file's path, as ch-run names it
        plant |= {name: None, f"{name}/bin": None, f"{name}/PLANTED": _PLANTED}
    for rel, p in found.items():
        want = plant.get(rel, False)
        if want is False or p.is_symlink() or (want is None) != p.is_dir():
            return False
        if want is not None and p.read_text() != want:
            return False
    shutil.rmtree(defaults)
    return True


@pytest.mark.parametrize(
    ("settings", "needle"),
    [({"partition": "nope"}, "invalid partition"), ({"gpus_per_node": 1}, "gres")],
)
def test_a_request_slurm_refuses_is_named_and_not_submitted(
    slurm: Slurm, demo_both: Demo, tmp_path: Path, settings: dict[str, object], needle: str
) -> None:
    proj = project(demo_both, slurm, tmp_path, container="docker", **settings)
    code, out = finish(*start(slurm, proj), timeout=120)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, out
    assert "sbatch refuses the job" in lines[0] and needle in lines[0].lower() and "Fix:" in lines[0], out
    assert slurm.run("squeue", "-h").stdout.strip() == ""
    assert not (proj / "compose" / "slurm.sbatch").exists()


def test_a_node_without_docker_ends_the_job_with_exit_2_naming_it(
    slurm: Slurm, demo_both: Demo, tmp_path: Path
) -> None:
    """Host 1's slurmd sees no docker program (as on a node where Docker is not installed): the task refuses
    before any container starts on any node, naming the node and the fix."""
    h1 = slurm.cluster.hosts[1]
    slurm.restart_node(h1, hide=["/usr/local/bin/docker"])
    code, out = finish(*start(slurm, project(demo_both, slurm, tmp_path, container="docker")), timeout=JOB_S)
    assert code == 2, out
    assert "nodekit: [node 1 on h1] docker is not on PATH. Fix: install Docker on every node" in out, out
    assert "nothing was started" in out and "ddp-demo: node 0/2" not in out, out
    nothing_left(slurm)
