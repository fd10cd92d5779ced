"""One node followed in one SSH command (nodekit/backends/fleet/follow.py): the script really runs under ``sh``, as a
host's login runs it, with a stand-in ``docker`` on PATH and an ``ssh`` that runs the command here (the real SSH path
is the cluster tier's: tests/cluster/test_fleet.py, test_faults.py, test_e2e.py)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.backends.fleet.follow import exit_code_of, follow, follow_script
from nodekit.backends.fleet.hosts import parse_host
from nodekit.errors import EngineError
from nodekit.system import proc
from tests.unit.backends.fleet.stand_ins import on_path

# The stand-in engine: MODE picks what it does; every call is written to $CALLS, one argument per line, then ---.
DOCKER = r"""#!/bin/sh
printf '%s\n' "$@" --- >> "$CALLS"  # one write: concurrent calls never interleave
case "$1" in
  ps)
    case "$MODE" in
      down) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1 ;;
      empty) exit 0 ;;
    esac
    echo 4f2c9e ;;
  logs)
    echo "nodekit demo: node 1/2"
    echo "a warning on stderr" >&2
    printf ' 10%%\r 20%%\r'
    echo "epoch 1 done"
    [ "$MODE" = cut ] && kill -TERM "$PPID"
    printf 'no newline at the end' ;;
  container)
    sleep 0.2
    [ "$MODE" = gone ] && { echo "Error response from daemon: No such container: 4f2c9e" >&2; exit 1; }
    echo 3 ;;
esac
"""

# The stand-in ssh: the remote command (the last argument) run by sh here; with MODE=cut the connection drops (255)
# once the log has started, as OpenSSH ends when a keepalive goes unanswered.
SSH = r"""#!/bin/sh
for a; do last=$a; done
sh -c "$last"
rc=$?
if [ "$MODE" = cut ]; then echo "Timeout, server 10.0.0.2 not responding." >&2; exit 255; fi
exit $rc
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    with on_path(tmp_path, {"docker": DOCKER, "ssh": SSH}) as calls:
        yield calls


def run(mode: str, project: str = "nodekit-demo-node1") -> tuple[list[str], int | EngineError]:
    lines: list[str] = []
    with proc.extra_env({"MODE": mode}):
        try:
            code: int | EngineError = follow(parse_host("ssh://root@10.0.0.2", 1), Path("unused.yaml"), project,
                                             "train", lines.append)  # fmt: skip
        except EngineError as e:
            code = e
    return lines, code


def test_the_log_then_the_exit_code_in_one_command(host: Path) -> None:
    lines, code = run("ok")
    assert code == 3
    # The job's stderr merged into its log, a redraw kept with its "\r", the last line without its ending.
    assert lines == ["nodekit demo: node 1/2", "a warning on stderr", " 10%\r", " 20%\r", "epoch 1 done",
                     "no newline at the end"]  # fmt: skip


def test_the_container_is_found_by_compose_s_labels_with_the_project_byte_for_byte(host: Path) -> None:
    project = 'it\'s a "demo" $HOME `x`'
    run("ok", project)
    calls = host.read_text().split("---\n")
    assert calls[0].splitlines() == ["ps", "--all", "--quiet", "--filter",
                                     f"label=com.docker.compose.project={project}", "--filter",
                                     "label=com.docker.compose.service=train"]  # fmt: skip
    asked = sorted(c.splitlines()[0] for c in calls[1:] if c.strip())
    assert asked == ["container", "logs"] and "4f2c9e" in host.read_text()


def test_a_dropped_connection_is_a_lost_node_after_the_lines_that_came(host: Path) -> None:
    lines, code = run("cut")
    assert isinstance(code, EngineError)
    assert code.message.startswith("lost root@10.0.0.2 while following nodekit-demo-node1: the SSH connection ended")
    assert "not responding" in code.message and lines[0] == "nodekit demo: node 1/2"


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("down", "its engine did not answer: Cannot connect to the Docker daemon"),
        ("empty", "its engine did not answer: compose project nodekit-demo-node1 has no container"),
        ("gone", "its engine did not answer: Error response from daemon: No such container: 4f2c9e"),
    ],
)
def test_an_engine_that_cannot_say_the_exit_code_is_a_lost_node(host: Path, mode: str, said: str) -> None:
    _, code = run(mode)
    assert isinstance(code, EngineError) and said in code.message, code


def test_the_exit_code_is_read_from_the_command_s_own_lines_only() -> None:
    assert exit_code_of(0, "nk-exit=0\n") == 0
    assert exit_code_of(0, "a login banner\nnk-exit=137\n") == 137
    assert exit_code_of(255, "nk-exit=0\nConnection closed\n") == "the SSH connection ended: Connection closed"
    assert exit_code_of(0, "") == "following its job failed (exit 0): no message"
    missing = "sh: 1: docker: not found"
    assert exit_code_of(1, missing + "\n") == f"following its job failed (exit 1): {missing}"


def test_the_script_quotes_what_it_is_given() -> None:
    service = "s'1"
    text = follow_script("p q", service)
    assert f"NK_PROJECT={shlex.quote('p q')}\n" in text and f"NK_SERVICE={shlex.quote(service)}\n" in text
