"""``nodekit run --dry-run``: the whole fleet's plan (nodekit/backends/fleet/plan.py), printed without touching any
host."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from nodekit.backends.fleet.hosts import fleet_hosts
from nodekit.config.settings import Settings
from tests.fake_runner import FakeRunner
from tests.golden import GOLDEN, update_golden

HOSTS = '["ssh://me@10.0.0.5", "ssh://me@10.0.0.6:2222", "ssh://me@gpu-c"]'


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "") -> None:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS", "NODEKIT_MAIN", "NODEKIT_RELAY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text(f'name = "t"\nscript = "train.py"\nhosts = {HOSTS}\n{extra}')
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)


def _dry_run(*argv: str) -> str:
    from typer.testing import CliRunner

    from nodekit.cli.app import app

    result = CliRunner().invoke(app, ["run", "--dry-run", *argv])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_dry_run_prints_every_ranks_plan_the_ship_plan_and_the_relay_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole plan, not the host list only (``#   node 1: ssh://...``)."""
    _project(tmp_path, monkeypatch, 'main = "192.168.8.5"\nnnodes = 3\nrestarts = 1\n[nodes.2]\nnproc_per_node = 2\n')
    text = _dry_run("--image", "nodekit/t:0123456789ab")
    # The project's directory is the test's own: its path, and the hash of each node file that holds it, vary.
    text = re.sub(r"config-hash=[0-9a-f]{64}", "config-hash=(sha256 of the node file)", text)
    text = text.replace(str(tmp_path), "/project")
    path = GOLDEN / "run-dry-run-3-hosts.txt"
    update_golden(path, text)
    assert text == path.read_text()


def test_the_dry_run_starts_no_process_resolves_no_name_and_writes_nothing(
    fake_runner: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --image a run asks this head's engine which image matches the project; a dry run says that is
    decided when run instead. Main given as a name is printed as given: resolving it is the run's business."""
    _project(tmp_path, monkeypatch, 'main = "head.example"\n')
    asked: list[object] = []

    def no_dns(*args: object, **kwargs: object) -> object:
        asked.append(args)
        raise OSError("the dry run resolved a name")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "gethostbyname", no_dns)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "fake-bin" not in p.parts)
    text = _dry_run()
    assert fake_runner.calls == [] and asked == []
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "fake-bin" not in p.parts) == before
    assert all(f"compose file: compose/node-{r}.yaml" in text for r in range(3)), text
    assert "image: decided when run: the image of t on this head" in text
    assert "main: head.example:29500" in text and "decided when run: the address this head resolves" in text


def test_a_configured_main_is_printed_not_host_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run prints the configured ``main``, not host 0's address (``main 10.0.0.5``)."""
    _project(tmp_path, monkeypatch, 'main = "192.168.8.5"\n')
    text = _dry_run("--image", "nodekit/t:1")
    assert "main: 192.168.8.5:29500" in text and "10.0.0.5:29500" not in text
    assert text.count("main 192.168.8.5:29500") == 3  # every rank's launch values


def test_without_main_the_dry_run_names_host_0s_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _project(tmp_path, monkeypatch)
    assert "main: 10.0.0.5:29500" in _dry_run("--image", "nodekit/t:1")


def _inputs(tmp_path: Path, urls: list[str], **kw: object) -> object:
    from nodekit.backends.fleet.nodes import job_settings
    from nodekit.backends.fleet.plan import FleetInputs

    s = Settings(project_dir=tmp_path, name="t", script="train.py", nnodes=len(urls), **kw)
    hosts = fleet_hosts(urls, len(urls), slots=[8] * len(urls))
    return FleetInputs(job_settings(s, hosts, restart=0), tuple(hosts), "nodekit/t:1", None, "10.0.0.1")


def test_relay_trees_come_from_the_push_grouping_ssh_hosts_only_one_tree_for_all(tmp_path: Path) -> None:
    from nodekit.backends.fleet.plan import FleetInputs, plan_fleet

    urls = [f"ssh://n{i}" for i in range(10)] + ["tcp://d:2375", "unix:///var/run/docker.sock"]
    inputs = _inputs(tmp_path, urls)
    assert isinstance(inputs, FleetInputs)
    plan = plan_fleet(inputs)
    assert plan.chains == (tuple(f"node {i}" for i in range(10)),)
    text = plan.to_text()
    assert "  the head feeds node 0\n  node 0 feeds node 1, node 2\n" in text and "  node 4 feeds node 9\n" in text
    assert "10 nodes, at most 2 fed by each, 4 hop(s) deep; 1 copy of the stream on the head's link" in text
    assert [(r.name, r.codec) for r in plan.receivers[-2:]] == [("node 10", "gzip"), ("node 11", "none")]
    assert all(r.nproc == "8" for r in plan.ranks)  # hostfile slots: processes per node
    assert "skipped if it is this head's own engine" in plan.to_text()


@pytest.mark.parametrize(("relay", "urls", "says"), [
    ("never", ["ssh://a", "ssh://b"], "relay: never"),
    ("always", ["ssh://a", "tcp://b:2375"], "relay: always, no tree"),
])  # fmt: skip
def test_no_tree_is_printed_where_none_would_form(tmp_path: Path, relay: str, urls: list[str], says: str) -> None:
    from nodekit.backends.fleet.plan import FleetInputs, plan_fleet

    inputs = _inputs(tmp_path, urls, relay=relay)
    assert isinstance(inputs, FleetInputs)
    plan = plan_fleet(inputs)
    assert plan.chains == () and says in plan.to_text() and "hop(s) deep" not in plan.to_text()


def test_the_dry_run_prints_each_nodes_file_and_docker_run_as_the_run_plans_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry run prints the plan the run applies, not a second planner's idea of it: an attempt of the run plans
    from what the hosts reported (here: what nodekit.toml declares of them, as the dry run assumes), and every
    rank's compose file and ``docker run`` arguments it would write and start are the ones the dry run printed."""
    import shlex

    from nodekit.backends.fleet.hosts import hosts_of
    from nodekit.backends.fleet.nodes import DRY_RUN_SECRET, gathered, job_settings
    from nodekit.backends.fleet.plan import plan
    from nodekit.backends.fleet.start import container_name
    from nodekit.config.settings import load
    from nodekit.job.secret import masked
    from nodekit.system.host.facts import Gathered, HostFacts

    _project(tmp_path, monkeypatch, 'main = "192.168.8.5"\nnnodes = 3\n[nodes.2]\ngpus = 4\n')
    text = _dry_run("--image", "nodekit/t:1")
    settings = load(tmp_path / "nodekit.toml")
    hosts = hosts_of(settings)
    reported = [Gathered(facts=HostFacts()) for _ in hosts]
    attempt = plan(gathered(job_settings(settings, hosts, restart=0), hosts, reported, "nodekit/t:1",
                            secret=DRY_RUN_SECRET, environ=os.environ)).detail  # fmt: skip
    assert [r.node.node.nproc for r in attempt.ranks if r.node] == [1, 1, 4]
    for r in attempt.ranks:
        assert r.node is not None and r.start, r
        argv = ["docker", "run", "--detach", "--name", container_name(r.node.project), *r.start]
        assert f"  start: {shlex.join(argv)} (on its host, over SSH)\n" in text
        assert f"{r.node.compose_path} (project {r.node.project}):\n{masked(r.node.text, DRY_RUN_SECRET)}" in text
    assert DRY_RUN_SECRET not in text


def test_the_dry_run_leaves_the_nodes_to_the_run_while_main_or_the_image_is_not_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(tmp_path, monkeypatch, 'main = "head.example"\n')
    text = _dry_run("--image", "nodekit/t:1")
    assert "  start:" not in text and "# would write" not in text
    assert "every node's compose file and start: decided when run: once the image and main's IP address" in text
    # A host's InfiniBand devices are its report's: the dry run does not refuse ib = "on" for lacking them.
    _project(tmp_path, monkeypatch, 'main = "10.0.0.5"\nib = "on"\n')
    text = _dry_run("--image", "nodekit/t:1")
    assert "  start:" not in text and "# would write" not in text
    assert 'decided when run: ib = "on" needs the InfiniBand devices each host reports' in text


def test_hosts_on_local_engine_sockets_are_checked_on_this_machine_not_over_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes on one machine (``unix://`` endpoints): no SSH is involved; the dry run and the run say how each is
    checked."""
    _project(tmp_path, monkeypatch)
    local = '["unix:///var/run/docker.sock", "unix:///run/second/docker.sock"]'
    (tmp_path / "nodekit.toml").write_text(f'name = "t"\nscript = "train.py"\nhosts = {local}\n')
    out = _dry_run("--image", "t:1")
    assert "SSH" not in out, out
    assert (
        "every host is checked on this machine, through its engine's socket (Docker engine and Compose, GPUs, "
        "mounts; ports 29500 and 29501 free on node 0)" in out
    )
    mixed = '["unix:///var/run/docker.sock", "ssh://me@10.0.0.6"]'
    (tmp_path / "nodekit.toml").write_text(f'name = "t"\nscript = "train.py"\nhosts = {mixed}\n')
    assert (
        "every host is checked: unix:// hosts on this machine, through its engine's socket, ssh:// hosts over SSH "
        "(Docker engine" in _dry_run("--image", "t:1")
    )
    from nodekit.backends.fleet.hosts import check_items

    # What the run's progress line names (backends/fleet/run.py), from the same hosts.
    assert check_items(fleet_hosts(["unix:///var/run/docker.sock", "unix:///run/second/docker.sock"], 2)) == (
        "Docker engine and Compose, GPUs, ports on main, the image"
    )
    assert check_items(fleet_hosts(["unix:///var/run/docker.sock", "ssh://me@10.0.0.6"], 2)).startswith("SSH, ")
