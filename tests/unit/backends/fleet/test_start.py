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
# values of the variables it takes by name to $CALLS.<name>, exactly. MODE picks how `run` ends.
DOCKER = r"""#!/bin/sh
printf '%s\0' "$@" >> "$CALLS"; printf '\n---\n' >> "$CALLS"
case "$1" in
  run)
    for n in NODEKIT_JOB_SECRET WANDB_API_KEY; do eval "v=\${$n-unset}"; printf '%s' "$v" > "$CALLS.$n"; done
    case "$MODE" in
      conflict) [ -f "$CALLS.removed" ] || { printf '%s %s\n' "docker: Error response from daemon: Conflict." \
          'The container name "/x" is already in use by container "4f2c".' >&2; exit 125; } ;;
      noimage) echo "docker: Error response from daemon: No such image: demo:1" >&2; exit 125 ;;
      fail) echo "docker: Error response from daemon: failed to create task: unknown device /dev/fuse." >&2; exit 127 ;;
      slow) sleep 1; echo started > "$CALLS.started" ;;
    esac
    echo 4f2c9e ;;
  rm) touch "$CALLS.removed" ;;
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
    assert runs(calls)[1] == ["rm", "--force", "nodekit-demo-node1-train-1"]


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
