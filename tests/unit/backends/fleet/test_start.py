"""One node's container started by its host's ``docker run`` in one SSH command (nodekit/backends/fleet/start.py): the
script really runs under ``sh``, as a host's login runs it, with a stand-in ``docker`` on PATH and an ``ssh`` that runs
the command here, its standard input passed on (the real engine and SSH: tests/cluster/test_fleet.py, where Compose
and ``nodekit down`` find the containers it starts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.backends.compose.node import NodePlan
from nodekit.backends.fleet import start
from nodekit.backends.fleet.hosts import parse_host
from nodekit.config.settings import Settings
from nodekit.errors import EngineError, ImageError
from nodekit.job.container import EnvVar, Mount, docker_mount
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.launcher.contract import Env
from nodekit.system import proc
from nodekit.system.host.facts import HostFacts
from tests.unit.backends.fleet.stand_ins import on_path

SECRET = "s3cret-value-of-the-job"
# Values a user may write: every one must reach the job as written.
AWKWARD = "a $HOME `id` 'q' \"d\" \\ ü\nsecond line\n"
KEY = "wandb-key $USER\n' \"\n"

# The stand-in engine: every call's arguments to $CALLS (each ended by a NUL, then a line ---); `run` also writes the
# values of the variables it takes by name to $CALLS.<name>, exactly. MODE picks how `run` ends. The container, once
# created, is the file $CALLS.container (its state in it); `rm` without --force refuses a running one, as Docker does.
DOCKER = r"""#!/bin/sh
printf '%s\0' "$@" >> "$CALLS"; printf '\n---\n' >> "$CALLS"
case "$1" in
  run)
    for n in NODEKIT_JOB_SECRET WANDB_API_KEY; do eval "v=\${$n-unset}"; printf '%s' "$v" > "$CALLS.$n"; done
    case "$MODE" in
      conflict) [ -f "$CALLS.removed" ] || { printf '%s %s\n' "docker: Error response from daemon: Conflict." \
          'The container name "/x" is already in use by container "4f2c".' >&2; exit 125; } ;;
      running) echo running > "$CALLS.container"; printf '%s %s\n' "docker: Error response from daemon: Conflict." \
          'The container name "/x" is already in use by container "4f2c".' >&2; exit 125 ;;
      noimage) echo "docker: Error response from daemon: No such image: demo:1" >&2; exit 125 ;;
      fail) echo "docker: Error response from daemon: failed to create task: unknown device /dev/fuse." >&2; exit 127 ;;
      slow) sleep "${SLOW:-1}"; echo started > "$CALLS.started" ;;
    esac
    echo running > "$CALLS.container"
    echo 4f2c9e ;;
  rm)
    if [ "$2" != --force ] && [ "$(cat "$CALLS.container" 2>/dev/null)" = running ]; then
      echo "Error response from daemon: cannot remove container: container is running" >&2; exit 1
    fi
    rm -f "$CALLS.container"; touch "$CALLS.removed" ;;
  inspect)
    [ -f "$CALLS.container" ] || { echo "Error: No such object: $3" >&2; exit 1; }
    cat "$CALLS.container" ;;
esac
"""

SSH = r"""#!/bin/sh
for a; do last=$a; done
exec sh -c "$last"
"""


@pytest.fixture
def calls(tmp_path: Path) -> Iterator[Path]:
    with on_path(tmp_path, {"docker": DOCKER, "ssh": SSH}) as out:
        yield out


def plan(tmp_path: Path) -> NodePlan:
    s = Settings(project_dir=Path("/p"), name="demo", script="train.py", nnodes=2, pass_env=("WANDB_API_KEY",))
    facts = HostFacts()
    node = node_spec(s, launch_spec(s), 1, "10.0.0.5", facts)
    spec = plan_container(node, facts, image="demo:1", output_dir=str(tmp_path / "out dir"), image_id="sha256:1",
                          job_secret=True)  # fmt: skip
    spec = dataclasses.replace(spec, env=(*spec.env, EnvVar("NOTE", AWKWARD)))
    return NodePlan(node=node, image="demo:1", facts=facts, container=spec, compose_path=Path("/p/compose/node-1.yaml"),
                    project_dir=Path("/p"),
                    project="nodekit-demo-node1", text="# node 1\n", job_secret=SECRET)  # fmt: skip


def run(tmp_path: Path, mode: str, environ: dict[str, str] | None = None) -> None:
    with proc.extra_env({"MODE": mode}):
        start.start(parse_host("ssh://root@10.0.0.2", 1), plan(tmp_path), environ=environ or {})


def runs(calls: Path) -> list[list[str]]:
    return [c.split("\0")[:-1] for c in calls.read_text().split("\n---\n") if c]


def test_the_secret_and_pass_env_reach_docker_by_name_byte_for_byte_and_no_argument_holds_them(
    tmp_path: Path, calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    real = proc.run
    monkeypatch.setattr(proc, "run", lambda argv, **kw: seen.append(list(argv)) or real(argv, **kw))
    run(tmp_path, "ok", {"WANDB_API_KEY": KEY, "UNRELATED": "x"})
    assert (calls.parent / "calls.NODEKIT_JOB_SECRET").read_text() == SECRET
    assert (calls.parent / "calls.WANDB_API_KEY").read_text() == KEY
    [argv] = runs(calls)
    assert argv[:4] == ["run", "--detach", "--name", "nodekit-demo-node1-train-1"]
    assert f"--env={Env.JOB_SECRET}" in argv and "--env=WANDB_API_KEY" in argv
    # Neither value in docker's arguments nor in ssh's (the host's process list and the head's).
    assert not any(SECRET in a or KEY in a for a in argv + seen[0])
    # A value written in the config reaches docker as one argument, as written (nothing substituted).
    assert f"--env=NOTE={AWKWARD}" in argv
    # Compose's own labels: `docker compose down` of the node's file and `nodekit down` find the container.
    assert "--label=com.docker.compose.project=nodekit-demo-node1" in argv
    assert "--label=com.docker.compose.service=train" in argv
    assert "--label=com.docker.compose.config-hash=" + start.config_hash("# node 1\n") in argv
    # The outputs directory is made where missing, as Compose's create_host_path made it.
    assert (tmp_path / "out dir").is_dir()


def test_an_unset_pass_env_is_not_set_in_the_container(tmp_path: Path, calls: Path) -> None:
    run(tmp_path, "ok", {})
    assert (calls.parent / "calls.WANDB_API_KEY").read_text() == "unset"
    assert (calls.parent / "calls.NODEKIT_JOB_SECRET").read_text() == SECRET


def test_a_container_left_by_an_earlier_run_is_replaced(tmp_path: Path, calls: Path) -> None:
    run(tmp_path, "conflict")
    verbs = [r[0] for r in runs(calls)]
    assert verbs == ["run", "rm", "run"]
    assert runs(calls)[1] == ["rm", "nodekit-demo-node1-train-1"]  # not --force: Docker refuses a running one


def test_a_running_container_of_the_name_is_not_replaced_and_the_start_names_it(tmp_path: Path, calls: Path) -> None:
    """Another run of this project owns it (two `nodekit run` at once): the later one must not take it over."""
    with pytest.raises(EngineError) as e:
        run(tmp_path, "running")
    assert "container nodekit-demo-node1-train-1 is running on this host" in e.value.message, e.value.message
    assert "does not replace" in e.value.message and "nodekit status" in (e.value.fix or "")
    assert [r[0] for r in runs(calls)] == ["run", "rm", "inspect"]
    assert (calls.parent / "calls.container").read_text() == "running\n"


def test_a_missing_image_names_the_push_that_fixes_it(tmp_path: Path, calls: Path) -> None:
    with pytest.raises(ImageError) as e:
        run(tmp_path, "noimage")
    assert "demo:1" in e.value.message and "never pulls" in e.value.message
    assert e.value.fix == "nodekit push demo:1 --to ssh://root@10.0.0.2"


def test_a_failed_start_says_dockers_line_and_leaves_nothing_created(tmp_path: Path, calls: Path) -> None:
    with pytest.raises(EngineError) as e:
        run(tmp_path, "fail")
    assert "unknown device /dev/fuse" in e.value.message and "node 1" in e.value.message
    assert [r[0] for r in runs(calls)] == ["run", "rm"]


def test_passed_values_are_one_line_each_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    spec = plan(tmp_path).container
    got = start.passed(spec, {Env.JOB_SECRET: SECRET}, {"WANDB_API_KEY": AWKWARD}).decode()
    assert got.endswith("\n\n") and len(got.strip("\n").split("\n")) == 2
    assert SECRET not in got and "second line" not in got
    with pytest.raises(ValueError, match="not a variable name"):
        start.passed(dataclasses.replace(spec, pass_env=("A=B",)), {}, {"A=B": "x"})


def test_a_bridge_network_node_is_left_to_compose(tmp_path: Path) -> None:
    spec = plan(tmp_path).container
    assert start.startable(spec)
    assert not start.startable(dataclasses.replace(spec, network="bridge", ports=(29500,)))
    assert (
        docker_mount(Mount('/d,a"ta', "/data", read_only=True)) == 'type=bind,"source=/d,a""ta",target=/data,readonly'
    )


def test_a_stop_signal_lets_a_start_in_flight_end_so_that_the_runs_down_comes_after_it(
    tmp_path: Path, calls: Path
) -> None:
    """The head's signal handler ends every child it started (proc.terminate_all); ending this ssh would not end the
    host's `docker run`, which could then create the container after the run's `down` had removed everything."""
    import threading
    import time

    stopper = threading.Timer(0.3, proc.terminate_all, kwargs={"grace": 10.0})
    stopper.start()
    t0 = time.monotonic()
    run(tmp_path, "slow")  # returns: the start ended on its own, with its exit code 0
    stopper.join()
    assert (calls.parent / "calls.started").read_text() == "started\n" and time.monotonic() - t0 < 10


# An ssh whose other end is another machine: the host's side runs in a session of its own, so the head's SIGKILL to
# this ssh's process group leaves it running, and its output reaches the head only through this ssh (the head's pipes
# close with it). UNREACHABLE_AFTER=N: the calls after the Nth fail as an ssh to a vanished host does (exit 255).
REMOTE_SSH = r"""#!/bin/sh
n=$(( $(cat "$CALLS.ssh" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$CALLS.ssh"
if [ -n "$UNREACHABLE_AFTER" ] && [ "$n" -gt "$UNREACHABLE_AFTER" ]; then
  echo "ssh: connect to host 10.0.0.2 port 22: No route to host" >&2; exit 255
fi
for a; do last=$a; done
out=$(mktemp "$CALLS.out.XXXXXX") err=$(mktemp "$CALLS.err.XXXXXX")
setsid sh -c "$last" >"$out" 2>"$err"
rc=$?
cat "$out"; cat "$err" >&2; rm -f "$out" "$err"
exit $rc
"""


def _interrupted_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[Path, list[str]]:
    """nodekit/backends/fleet/run.py's order: `_start`, SIGINT to this process while the host's docker run (3 s)
    is in flight, the stop's grace (0.5 s here), then the run's `_down` (stubbed: it removes what exists at that
    moment, as `compose down` does). Returns the container file and the reporter's lines."""
    import os
    import signal
    import threading

    from nodekit.backends.fleet import run as fleet_run
    from nodekit.system.progress import RecordingReporter

    p = plan(tmp_path)
    args = start.run_args(p.container, project=p.project, compose_file=p.compose_path, compose_text=p.shown)
    live = [fleet_run._Live(plan=p, host=parse_host("ssh://root@10.0.0.2", 1), args=tuple(args))]
    container = tmp_path / "calls.container"
    monkeypatch.setattr(fleet_run, "_down", lambda live, *a, **k: container.unlink(missing_ok=True) or [])
    reporter = RecordingReporter()
    env = {"MODE": "slow", "SLOW": "3", **env}
    with proc.extra_env(env), pytest.raises(proc.Interrupted), proc.stopping(grace=0.5):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            fleet_run._start(live, reporter)
        except KeyboardInterrupt:
            fleet_run._down(live)
            raise
    return container, [m for _, m in reporter.events]


def _after_the_hosts_docker_run(tmp_path: Path) -> None:
    """Wait (deadline 10 s) until the host's docker run of 3 s has ended, and a moment more for what it does last."""
    import time

    end = time.monotonic() + 10
    while not (tmp_path / "calls.started").exists() and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(0.5)


def test_a_start_that_outlives_the_stop_s_grace_leaves_no_container_after_the_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C, SIGTERM or SIGHUP while a host's docker run takes longer than the grace: the head kills its ssh, the
    host's docker run goes on and creates the container after the run's down. The start now waits for it there and
    removes the container."""
    with on_path(tmp_path, {"docker": DOCKER, "ssh": REMOTE_SSH}):
        container, said = _interrupted_start(tmp_path, monkeypatch)
        _after_the_hosts_docker_run(tmp_path)
    assert (tmp_path / "calls.started").exists(), "the host's docker run did not run to its end"
    assert not container.exists(), "the container the host's docker run created after the down is still there"
    assert any("outlived the stop's grace" in line for line in said), said


def test_a_host_that_cannot_be_reached_to_settle_its_start_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with on_path(tmp_path, {"docker": DOCKER, "ssh": REMOTE_SSH}):
        _, said = _interrupted_start(tmp_path, monkeypatch, UNREACHABLE_AFTER="1")
        _after_the_hosts_docker_run(tmp_path)
    line = next(line for line in said if "may be left there" in line)
    assert "node 1's container on" in line and "No route to host" in line, line
    assert "nodekit down --node 1 once 10.0.0.2 answers" in line, line


def test_a_10000_node_start_with_per_node_gpus_keeps_every_argument_small(
    tmp_path: Path, calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's script grows with the job (every node's declared GPUs and processes: 170 kB at 10,000 nodes, the
    documented bound); as one argument of ssh and of the host's `sh -c` it passed Linux's 128 KiB per argument
    (Argument list too long). It travels on standard input; docker run's own arguments stay under the bound."""
    from nodekit.config.settings import NodeOverride

    n = 10_000
    s = Settings(project_dir=Path("/p"), name="demo", script="train.py", nnodes=n,
                 nodes={r: NodeOverride(gpus=8) for r in range(n)})  # fmt: skip
    facts = HostFacts(gpu_count=8)
    node = node_spec(s, launch_spec(s), n - 1, "10.0.0.5", facts)
    spec = plan_container(node, facts, image="demo:1", output_dir=str(tmp_path / "out"), image_id="sha256:1",
                          job_secret=True)  # fmt: skip
    big = NodePlan(node=node, image="demo:1", facts=facts, container=spec, compose_path=Path("/p/compose/node.yaml"),
                   project="nodekit-demo-node9999", text="# node\n", job_secret=SECRET,
                   project_dir=Path("/p"))  # fmt: skip
    seen: list[list[str]] = []
    real = proc.run
    monkeypatch.setattr(proc, "run", lambda argv, **kw: seen.append(list(argv)) or real(argv, **kw))
    with proc.extra_env({"MODE": "ok"}):
        start.start(parse_host("ssh://root@10.0.0.2", n - 1), big, environ={})
    assert max(len(a) for a in seen[0]) <= 32 * 1024, "an argument of ssh grows with the number of nodes"
    [argv] = runs(calls)
    declared = ",".join(f"{r}:8" for r in range(n))
    assert f"--env=NODEKIT_GPUS_DECLARED={declared}" in argv
    assert max(len(a.encode()) for a in argv) < 131072  # MAX_ARG_STRLEN: docker run's own arguments
    assert (calls.parent / "calls.NODEKIT_JOB_SECRET").read_text() == SECRET
