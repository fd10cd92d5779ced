"""Gather, then plan: :func:`nodekit.job.gather.gather_node` does every read a node's plan needs, once, into a frozen
:class:`NodeWorld` (main's address, host facts, the mount sources, the image on the engine and its id, the job
secret, ``os.environ`` and the working directory) with the node decided once; :func:`nodekit.backends.compose.node.plan`
is a pure function of the settings and that value.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from nodekit.backends.compose.node import NodePlan, plan
from nodekit.backends.fleet.hosts import fleet_hosts
from nodekit.backends.fleet.remote import Gathered
from nodekit.config.settings import Mount, NodeOverride, Settings
from nodekit.errors import ImageError, UsageError
from nodekit.job.gather import NodeWorld, gather_node, world_of
from nodekit.system.host.facts import HostFacts
from tests.factories import CPU_NODE, GPU_NODE, plan_here
from tests.golden import GOLDEN, update_golden

PROJECT = Path("/srv/project")
SECRET = "s3cr3t-" * 5
IMAGE_ID = "sha256:" + "cd" * 32


def _settings(**kw: object) -> Settings:
    base: dict[str, object] = {
        "name": "demo",
        "script": "train.py",
        "args": ("--epochs", "3"),
        "nnodes": 2,
        "pass_env": ("HF_TOKEN", "WANDB_API_KEY"),
        "mounts": (Mount(host="/srv/data", container="/data", check="sizes"),),
    }
    return Settings(project_dir=PROJECT, **(base | kw))  # type: ignore[arg-type]


def _world(settings: Settings | None = None, rank: int = 1, **kw: object) -> NodeWorld:
    base: dict[str, object] = {
        "image": "nodekit/demo:0123456789ab",
        "cwd": PROJECT,
        "image_note": "its fingerprint 0123456789ab is the project's as it is now",
        "image_id": IMAGE_ID,
        "job_secret": SECRET,
        "env_set": frozenset({"HF_TOKEN"}),
    }
    return world_of(settings or _settings(), rank, "10.0.0.5", GPU_NODE, **(base | kw))  # type: ignore[arg-type]


def plan_node(settings: Settings, world: NodeWorld, debug: bool = False) -> NodePlan:
    return plan(settings, world, debug=debug).detail


def _refuse(*args: object, **kwargs: object) -> object:
    raise AssertionError(f"plan_node reached outside its arguments: {args!r}")


def test_plan_node_reads_nothing_outside_its_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same text with the environment empty, another working directory, and every way out (DNS, sockets,
    processes, the engine through them, the file system's stat, the cwd) made to raise."""
    s, world = _settings(), _world()
    before = plan_node(s, world)  # also loads the packaged compose template (cached): nodekit's asset, not the world
    with monkeypatch.context() as m:
        for name in list(os.environ):
            m.delenv(name)
        m.chdir(tmp_path)
        for attr in ("getaddrinfo", "gethostbyname", "create_connection", "socket"):
            m.setattr(socket, attr, _refuse)
        for attr in ("Popen", "run", "check_output"):
            m.setattr(subprocess, attr, _refuse)
        for attr in ("stat", "lstat", "getcwd", "listdir", "scandir"):
            m.setattr(os, attr, _refuse)
        m.setattr(Path, "cwd", _refuse)
        after = plan_node(s, world)
    assert after == before
    assert after.compose_path == PROJECT / "compose" / "node-1.yaml"
    assert after.warnings == (
        "pass_env WANDB_API_KEY is not set in this shell: the job runs without it (export WANDB_API_KEY=... before "
        "nodekit up)",
    )
    assert after.notes[-1] == f"image {world.image}: {world.image_note}"
    env = yaml.safe_load(after.text)["services"]["train"]["environment"]
    assert env["NODEKIT_IMAGE_ID"] == IMAGE_ID and env["NODEKIT_JOB_SECRET"] == SECRET
    assert env["HF_TOKEN"] is None and env["WANDB_API_KEY"] is None  # names only: Compose takes them from the shell


def test_golden_plan_of_a_gathered_world() -> None:
    """One GPU node's compose text, every input a value: the world above, a per-node mount path and debug."""
    s = _settings(nodes={1: NodeOverride(mounts={"/data": "/mnt/nvme/data"})})
    text = plan_node(s, _world(s), debug=True).text
    path = GOLDEN / "node-1-world.yaml"
    update_golden(path, text)
    assert text == path.read_text()


def test_the_world_decides_and_the_settings_are_still_checked_against_it() -> None:
    """A world made by hand is held to what gathering refuses: a mount source its host lacks, a rank outside the job,
    a loopback node with a remote main."""
    with pytest.raises(UsageError, match=r"mount /srv/data \(for /data\) does not exist on node 1") as e:
        _world(absent=("/srv/data",))
    assert "[nodes.1] mounts" in (e.value.fix or "")
    with pytest.raises(UsageError, match=r"node rank 2 is outside 0\.\.1"):
        _world(rank=2)
    with pytest.raises(UsageError, match="no other machine can reach it"):
        _world(_settings(nodes={1: NodeOverride(addr="127.0.0.1")}))


def test_gather_node_gathers_once_and_asks_for_the_secret_last(tmp_path: Path) -> None:
    """The shell's values stay in the shell (names only in the world); a failed image lookup asks for no secret
    (asked first, it could create the project's secret file for a node that then fails)."""
    (tmp_path / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    s = Settings(
        project_dir=tmp_path, name="demo", script="train.py", nnodes=2, pass_env=("HF_TOKEN", "OTHER"),
        mounts=(Mount(host=str(tmp_path / "data"), container="/data"),),
    )  # fmt: skip
    asked: list[str] = []

    def secret() -> str:
        asked.append("secret")
        return SECRET

    world = gather_node(
        s, 1, "10.0.0.5", image="x:y", facts=CPU_NODE, environ={"HF_TOKEN": "hf_value", "PATH": "/bin"},
        image_id=lambda ref: IMAGE_ID, job_secret=secret,
    )  # fmt: skip
    assert world == world_of(
        s, 1, "10.0.0.5", CPU_NODE, image="x:y", cwd=Path.cwd(), image_id=IMAGE_ID, job_secret=SECRET,
        env_set=frozenset({"HF_TOKEN"}),
    )  # fmt: skip
    assert asked == ["secret"] and "hf_value" not in repr(world)
    assert plan_node(s, world) == plan_here(
        s, 1, "10.0.0.5", image="x:y", facts=CPU_NODE, environ={"HF_TOKEN": "hf_value"},
        image_id=lambda ref: IMAGE_ID, job_secret=lambda: SECRET,
    )  # fmt: skip

    def missing(ref: str) -> str:
        raise ImageError(f"image {ref} is not on this host", fix="nodekit push")

    asked.clear()
    with pytest.raises(ImageError):
        gather_node(s, 1, "10.0.0.5", image="x:y", facts=CPU_NODE, image_id=missing, job_secret=secret)
    assert asked == []


def test_the_fleet_plans_each_rank_from_its_own_hosts_world(tmp_path: Path) -> None:
    """Each rank's plan takes the facts its host reported (here: 8 GPUs on one, none on the other), main's address
    resolved once, and the run's one secret and image id."""
    from nodekit.backends.fleet.nodes import gathered
    from nodekit.backends.fleet.plan import plan

    (tmp_path / "train.py").write_text("")
    s = Settings(project_dir=tmp_path, name="demo", script="train.py", nnodes=2, pass_env=("HF_TOKEN",))
    hosts = fleet_hosts(["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"], 2)
    reported = [Gathered(facts=CPU_NODE), Gathered(facts=GPU_NODE)]
    inputs = gathered(s, hosts, reported, "nodekit/demo:1", image_id=IMAGE_ID, secret=SECRET, environ={})
    assert inputs.facts == (CPU_NODE, GPU_NODE)
    plans = plan(inputs).detail.nodes
    assert [p.facts for p in plans] == [CPU_NODE, GPU_NODE]
    assert {(p.node.main_addr, p.image, p.image_id, p.job_secret) for p in plans} == {
        ("10.0.0.5", "nodekit/demo:1", IMAGE_ID, SECRET)
    }
    assert [p.node.nproc for p in plans] == [1, 8]
    assert [p.compose_path.name for p in plans] == ["node-0.yaml", "node-1.yaml"]
    assert all(p.warnings and "HF_TOKEN" in p.warnings[0] for p in plans)
    with pytest.raises(UsageError, match=r"training script gone\.py not found"):
        gathered(s.model_copy(update={"script": "gone.py"}), hosts, reported, "nodekit/demo:1")


def test_the_fleet_refuses_a_main_that_is_none_of_host_0_s_addresses(tmp_path: Path) -> None:
    """Host networking: node 0 serves the rendezvous on main's address. A main host 0 does not have would start every
    node, each to wait rdzv_timeout for it (issue 46); refused in one line, exit 2, before any node starts."""
    from nodekit.backends.fleet.nodes import gathered
    from nodekit.backends.fleet.plan import plan

    (tmp_path / "train.py").write_text("")
    s = Settings(project_dir=tmp_path, name="demo", script="train.py", nnodes=2, main="10.0.0.9")
    hosts = fleet_hosts(["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"], 2)
    own = frozenset({"127.0.0.1", "10.0.0.5", "fe80::1"})
    reported = [Gathered(facts=CPU_NODE, addresses=own), Gathered(facts=CPU_NODE)]
    with pytest.raises(UsageError) as e:
        gathered(s, hosts, reported, "nodekit/demo:1")
    assert e.value.exit_code == 2 and "\n" not in e.value.one_line()
    assert e.value.message == (
        "main = '10.0.0.9' (10.0.0.9) is none of node 0 (me@10.0.0.5)'s addresses (10.0.0.5, fe80::1): every node "
        "would wait for a main that is not there"
    )
    assert "remove main" in e.value.fix
    for fine in (s.model_copy(update={"main": "10.0.0.5"}), s.model_copy(update={"main": None})):
        assert gathered(fine, hosts, reported, "nodekit/demo:1").main_ip == "10.0.0.5"
    unknown = [Gathered(facts=CPU_NODE), Gathered(facts=CPU_NODE)]  # a tcp:// host 0 reports no addresses
    assert gathered(s, hosts, unknown, "nodekit/demo:1").main_ip == "10.0.0.9"
    bridge = s.model_copy(update={"network": "bridge"})  # main publishes its ports: not host 0's address check
    with pytest.raises(UsageError, match=r'network = "bridge" with main 10\.0\.0\.9'):  # the node's own decision
        plan(gathered(bridge, hosts, reported, "nodekit/demo:1"))


def test_host_facts_are_gathered_with_the_route_to_main_only_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without facts, gathering asks this host (and refuses no route to main); with them, it asks nothing."""
    from nodekit.errors import NetworkError
    from nodekit.system.host import facts as host_facts

    gathered: list[str | None] = []

    def gather(main_ip: str | None = None) -> HostFacts:
        gathered.append(main_ip)
        return CPU_NODE.model_copy(update={"iface": None})

    monkeypatch.setattr(host_facts, "gather", gather)
    s = Settings(project_dir=Path(__file__).parent, name="demo", script=Path(__file__).name, nnodes=2)
    with pytest.raises(NetworkError, match=r"no route to main address 10\.9\.9\.9"):
        gather_node(s, 1, "10.9.9.9", image="x:y")
    assert gathered == ["10.9.9.9"]
    gather_node(s, 1, "10.9.9.9", image="x:y", facts=CPU_NODE)
    assert gathered == ["10.9.9.9"]


def test_a_dry_run_reads_the_probe_cache_and_never_starts_the_probe_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nodekit compose/up --dry-run` choose the image through the base's probe: from its cache, or not at all."""
    from nodekit.config.settings import Settings
    from nodekit.image import probe
    from nodekit.system import docker

    settings = Settings(project_dir=tmp_path, name="p", script="train.py", base_image="pytorch/pytorch:x")
    base = docker.ImageInfo(id="sha256:" + "a" * 64, tags=("pytorch/pytorch:x",), labels={}, size=1)
    started: list[str] = []

    def probe_image(image: str, *args: object, **kwargs: object) -> str:
        started.append(image)
        return json.dumps(_CONDA)

    monkeypatch.setattr(docker, "probe_image", probe_image)
    with pytest.raises(ImageError) as info:
        probe.target(settings, require_probe=True, base=base, cached_only=True)
    assert "has not been probed on this machine yet" in info.value.message and "--dry-run" in (info.value.fix or "")
    assert started == [] and not (tmp_path / ".nodekit").exists()  # no container, no cache file
    probed = probe.target(settings, require_probe=True, base=base)  # a real run probes once and caches
    assert started == [base.id] and probed.python_version == "3.11"
    again = probe.target(settings, require_probe=True, base=base, cached_only=True)
    assert again == probed and started == [base.id]  # the dry run now reads the cache


_CONDA = {
    "python": "/opt/conda/bin/python3", "kind": "conda", "version": "3.11.9", "implementation": "cpython",
    "libc": "glibc", "libc_version": "2.35", "machine": "x86_64", "pip": True, "ensurepip": True,
    "site": ["/opt/conda/lib/python3.11/site-packages"], "dists": {"torch": "2.5.0"},
    "torch": {"__version__": "2.5.0+cu124", "cuda": "12.4", "git_version": "abc"},
}  # fmt: skip


def test_nodekit_compose_decides_the_node_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gathering refuses a bad node by deciding it, and that node is the one planned: the way from ``nodekit up`` (and
    ``compose``) to the compose file decides each node once, not once to refuse and again to plan."""
    import sys

    from typer.testing import CliRunner

    from nodekit.cli.app import app
    from nodekit.job import spec

    for var in [v for v in os.environ if v.startswith("NODEKIT_")]:
        monkeypatch.delenv(var)
    (tmp_path / "nodekit.toml").write_text('name = "once"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    decided: list[int] = []
    original = spec.node_spec

    def counted(*args: object, **kwargs: object) -> spec.NodeSpec:
        node = original(*args, **kwargs)  # type: ignore[arg-type]
        decided.append(node.rank)
        return node

    for module in [m for name, m in sys.modules.items() if name.startswith("nodekit.")]:
        if getattr(module, "node_spec", None) is original:
            monkeypatch.setattr(module, "node_spec", counted)
    result = CliRunner().invoke(app, ["compose", "-r", "1", "--main", "127.0.0.1", "--image", "i:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert decided == [1]


def test_the_gatherer_reads_and_the_spec_decides() -> None:
    """``job/spec.py`` holds the node's decisions (main's address, the node, its refusals) and reads nothing: it
    imports no module that reaches the environment, the network, processes or the engine, which ``job/gather.py``
    does, and every function of the gatherer that takes the settings either reads something or hands them on."""
    import ast

    import nodekit.job.gather as gather_mod
    import nodekit.job.spec as spec_mod

    readers = {"os", "socket", "subprocess", "shutil", "nodekit.system.proc", "nodekit.system.host.net",
               "nodekit.system.docker", "nodekit.system.host", "nodekit.job.gather"}  # fmt: skip

    def imported(module: object) -> set[str]:
        tree = ast.parse(Path(str(getattr(module, "__file__", ""))).read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        return names

    assert not imported(spec_mod) & readers, imported(spec_mod) & readers
    assert {"nodekit.system.host.net", "os"} <= imported(gather_mod)
    for name in ("main_address", "decide_node"):
        assert getattr(gather_mod, name) is getattr(spec_mod, name)  # the gatherer uses the spec's, defines none
        assert f"def {name}(" not in Path(str(gather_mod.__file__)).read_text()
