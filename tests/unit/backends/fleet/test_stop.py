"""Every ``ssh://`` node that its host's ``docker run`` started is stopped and removed by the host's own docker CLI in
one SSH command (nodekit/backends/fleet/stop.py), not by ``docker compose down`` through the docker CLI's ``ssh://``
transport on the head (a docker CLI and the Compose plugin per node there). The script really runs under ``sh``, as
a host's login runs it, with a stand-in ``docker`` on PATH and an ``ssh`` that runs the command here (the real engine
and SSH: tests/cluster/test_fleet.py, where nothing of a run is left on its hosts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.backends.compose.node import NodePlan
from nodekit.backends.fleet import run as fleet_run
from nodekit.backends.fleet import stop
from nodekit.backends.fleet.hosts import parse_host
from nodekit.config.settings import Settings
from nodekit.errors import EngineError
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.system import proc
from nodekit.system.host.facts import HostFacts
from tests.unit.backends.fleet.stand_ins import on_path

# The stand-in engine: every call's arguments to $CALLS, one per line, then ---. Containers are the files
# $CALLS.c.<id> holding their project and state; MODE=down: the engine does not answer.
DOCKER = r"""#!/bin/sh
printf '%s\n' "$@" --- >> "$CALLS"  # one write: concurrent calls never interleave
[ "$MODE" = down ] && { echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1; }
case "$1" in
  ps)
    for a; do case $a in label=com.docker.compose.project=*) want=${a#label=com.docker.compose.project=} ;; esac; done
    for f in "$CALLS".c.*; do
      [ -e "$f" ] || continue
      read -r p s < "$f"; if [ "$p" = "$want" ]; then echo "${f##*.c.}"; fi
    done ;;
  stop)
    [ "$MODE" = nokill ] && { echo "Error response from daemon: cannot stop container: tried to kill container, but \
did not receive an exit event" >&2; exit 1; }
    shift 3; for c; do read -r p s < "$CALLS.c.$c"; echo "$p exited" > "$CALLS.c.$c"; done ;;
  rm) shift 2; for c; do rm "$CALLS.c.$c"; done ;;
  *) echo "not answered here: $*" >&2; exit 1 ;;
esac
"""

SSH = r"""#!/bin/sh
for a; do last=$a; done
exec sh -c "$last"
"""


def plan(tmp_path: Path) -> NodePlan:
    """Node 1 of a two-node job, on a host network (the containers its host's ``docker run`` starts)."""
    s = Settings(project_dir=Path("/p"), name="demo", script="train.py", nnodes=2)
    facts = HostFacts()
    node = node_spec(s, launch_spec(s), 1, "10.0.0.5", facts)
    spec = plan_container(node, facts, image="demo:1", output_dir=str(tmp_path / "out"), image_id="sha256:1")
    return NodePlan(node=node, image="demo:1", facts=facts, container=spec, compose_path=Path("/p/compose/node-1.yaml"),
                    project_dir=Path("/p"), project="nodekit-demo-node1", text="# node 1\n")  # fmt: skip


@pytest.fixture
def calls(tmp_path: Path) -> Iterator[Path]:
    with on_path(tmp_path, {"docker": DOCKER, "ssh": SSH}) as out:
        yield out


def containers(calls: Path) -> dict[str, str]:
    return {p.name.split(".c.")[1]: p.read_text().strip() for p in calls.parent.glob("calls.c.*")}


def test_a_run_s_end_stops_and_removes_its_containers_on_the_host_without_compose_on_the_head(
    calls: Path, tmp_path: Path
) -> None:
    p = plan(tmp_path)
    (calls.parent / "calls.c.4f2c").write_text(f"{p.project} running\n")
    (calls.parent / "calls.c.9a1b").write_text("another-project running\n")
    live = [fleet_run._Live(plan=p, host=parse_host("ssh://root@10.0.0.2", 1))]
    assert fleet_run._down(live, timeout=7) == []
    assert containers(calls) == {"9a1b": "another-project running"}
    said = calls.read_text().split("---\n")
    assert [c.split("\n")[0] for c in said if c] == ["ps", "stop", "ps", "rm"], said
    assert said[1] == "stop\n--time\n7\n4f2c\n" and said[3] == "rm\n--force\n4f2c\n"
    assert not any(c.startswith(("--host", "compose")) for c in said), said  # no docker CLI, no Compose on the head


def test_keep_containers_stops_them_and_keeps_them(calls: Path, tmp_path: Path) -> None:
    p = plan(tmp_path)
    (calls.parent / "calls.c.4f2c").write_text(f"{p.project} running\n")
    live = [fleet_run._Live(plan=p, host=parse_host("ssh://root@10.0.0.2", 1))]
    assert fleet_run._down(live, keep=True) == []
    assert containers(calls) == {"4f2c": f"{p.project} exited"}


def test_a_stop_that_fails_still_ends_in_the_removal(calls: Path, tmp_path: Path) -> None:
    """An engine under load can fail a stop (it missed the container's exit event); the end still removes it, as
    ``compose down`` does, instead of leaving it and naming the host unreachable."""
    p = plan(tmp_path)
    (calls.parent / "calls.c.4f2c").write_text(f"{p.project} running\n")
    with proc.extra_env({"MODE": "nokill"}):
        assert fleet_run._down([fleet_run._Live(plan=p, host=parse_host("ssh://root@10.0.0.2", 1))]) == []
    assert containers(calls) == {}


def test_nothing_left_to_stop_is_no_failure(calls: Path) -> None:
    stop.stop(parse_host("ssh://root@10.0.0.2", 1), "nodekit-demo-node1", timeout=10)
    assert calls.read_text().split("\n")[0] == "ps"


def test_an_engine_that_does_not_answer_names_the_host_and_the_run_s_end_names_it_left(
    calls: Path, tmp_path: Path
) -> None:
    host = parse_host("ssh://root@10.0.0.2", 1)
    with proc.extra_env({"MODE": "down"}):
        with pytest.raises(EngineError, match=r"stopping nodekit-demo-node1 on .*10\.0\.0\.2.* Cannot connect"):
            stop.stop(host, "nodekit-demo-node1", timeout=10)
        assert fleet_run._down([fleet_run._Live(plan=plan(tmp_path), host=host)]) == [host]


def test_the_script_quotes_what_it_is_given() -> None:
    assert "NK_PROJECT='a b;rm -rf /'\n" in stop.stop_script("a b;rm -rf /", 10)
