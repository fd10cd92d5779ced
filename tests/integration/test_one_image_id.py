"""One image, one id, however each node was started (issue 46: a false STACK MISMATCH, exit 17, on one machine with
one image, because `up --build` and plain `up` named the image two ways).

On each image store, the same image is started once each way a node can be started: `nodekit up --build`, plain
`nodekit up`, `nodekit up --image TAG`, `nodekit run` (one unix:// host) and by hand (`docker compose up` with the
file `nodekit compose` wrote); one node each, a job that prints the image id its node was given (what its preflight
compares with the other nodes'). Every id each command names is collected (the job's, the compose file's
NODEKIT_IMAGE_ID, `nodekit runs show`, the run's report, `nodekit push`): one id per store. `nodekit compose` needs
no image where it runs (it may write the file for another machine), so its file names none and a node started from
it is compared by its fingerprint alone: never a mismatch either. A test per pair of ways reads them from there; the
pair the issue reported (`up --build` on node 1, plain `up` on node 0) also runs as a real 2-node job and passes
its preflight.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.integration.helpers import CLASSIC_HOST, here_as_hosts, nodekit

pytestmark = pytest.mark.docker

WAYS = ("up --build", "up", "up --image", "run", "compose by hand")
STORES = ("classic", "containerd")
PORTS = {"classic": 29810, "containerd": 29820}  # master_port; the preflight takes the next one
PRINTED = re.compile(r"nodekit-image-id (\S+)")


@dataclass
class Seen:
    """One store's project and every id the commands named, by way (``up``, ...) and by who named it."""

    store: str
    project: Path
    engine: str
    tag: str = ""
    ids: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.engine}

    @property
    def config(self) -> Path:
        return self.project / "nodekit.toml"

    def flags(self, nnodes: int = 1) -> list[str]:
        return ["--nnodes", str(nnodes), "--script", "ids.py", "--master-port", str(PORTS[self.store])]


def short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def printed(out: str) -> str:
    found = PRINTED.findall(out)
    assert len(found) == 1, out[-3000:]
    return found[0]


def compose_id(path: Path) -> str:
    doc = yaml.safe_load(path.read_text())
    return str(doc["services"]["train"]["environment"].get("NODEKIT_IMAGE_ID", "-"))


def recorded(s: Seen) -> dict[str, str]:
    """The last run's id as `nodekit runs show` gives it (whole) and as its HTML report prints it (19 characters)."""
    shown = nodekit("runs", "show", "last", "--json", config=s.config)
    assert shown.returncode == 0, shown.stderr
    whole = json.loads(shown.stdout)["image_id"]
    made = nodekit("runs", "report", "last", config=s.config)
    assert made.returncode == 0, made.stderr
    page = Path(made.stdout.strip().splitlines()[-1]).read_text()
    in_report = re.search(r"id <code>([^<]*)</code>", page)
    assert in_report is not None and whole.startswith(in_report.group(1)), in_report
    return {"runs show": whole, "report": in_report.group(1)}


def start_each_way(s: Seen) -> None:
    up = ["up", "--node-rank", "0", "--main", "127.0.0.1", *s.flags()]
    node_file = s.project / "compose" / "node-0.yaml"
    for way, extra in (("up --build", ["--build"]), ("up", []), ("up --image", ["--image", s.tag])):
        try:
            ran = nodekit(*up, *extra, config=s.config, env=s.env, timeout=300)
        finally:
            nodekit("down", "--node-rank", "0", config=s.config, env=s.env)
        assert ran.returncode == 0, f"{way}: " + ran.stdout[-3000:] + ran.stderr[-3000:]
        s.ids[way] = {"job": printed(ran.stdout), "compose file": compose_id(node_file), **recorded(s)}
    try:
        ran = nodekit("run", *s.flags(), config=s.config, env=here_as_hosts(s.engine), timeout=300)
    finally:
        nodekit("down", config=s.config, env=here_as_hosts(s.engine))
    assert ran.returncode == 0, "run: " + ran.stdout[-3000:] + ran.stderr[-3000:]
    s.ids["run"] = {"job": printed(ran.stdout), "compose file": compose_id(node_file), **recorded(s)}
    made = nodekit("compose", "--node-rank", "0", "--main", "127.0.0.1", *s.flags(), config=s.config, env=s.env)
    assert made.returncode == 0, made.stderr
    path = made.stdout.strip()
    by_hand = ["docker", "-H", s.engine, "compose", "-f", path]
    try:
        ran = subprocess.run([*by_hand, "up"], capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run([*by_hand, "down"], capture_output=True, timeout=120)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    s.ids["compose by hand"] = {"job": printed(ran.stdout), "compose file": compose_id(Path(path))}
    pushed = nodekit("push", s.tag, "--to", f"here={s.engine}", "--dry-run", config=s.config, env=s.env)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    named = re.findall(r"\(([0-9a-f]{12})[,)]|already has ([0-9a-f]{12})", pushed.stdout)
    assert named, pushed.stdout
    s.ids["push"] = {f"push {i}": a or b for i, (a, b) in enumerate(named)}


@pytest.fixture(scope="module", params=STORES)
def seen(request: pytest.FixtureRequest, probe_project: Callable[[str], Path]) -> Seen:
    store = request.param
    engine = request.getfixturevalue("containerd_engine") if store == "containerd" else CLASSIC_HOST
    s = Seen(store, probe_project(engine), engine)
    s.tag = json.loads((s.project / ".nodekit" / "last-build.json").read_text())["tag"]
    start_each_way(s)
    return s


def test_every_command_names_the_image_by_one_id(seen: Seen) -> None:
    named = {f"{way}: {who}": i for way, by in seen.ids.items() for who, i in by.items()}
    assert {k for k, i in named.items() if i == "-"} == {"compose by hand: job", "compose by hand: compose file"}
    assert {short(i) for i in named.values() if i != "-"} == {short(seen.ids["up"]["job"])}, named
    whole = {k: i for k, i in named.items() if len(i) > 19}
    assert len(set(whole.values())) == 1, whole


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(WAYS, 2)), ids=lambda w: w.replace(" ", "-"))
def test_two_ways_of_starting_a_node_give_one_id(seen: Seen, a: str, b: str) -> None:
    """What the preflight compares: the id each node's job was given, where both know one (a node started from
    `nodekit compose`'s file knows none: the fingerprint alone is compared). Equal, so no pair is a false mismatch."""
    ids = {seen.ids[a]["job"], seen.ids[b]["job"]}
    assert len(ids - {"-"}) == 1, (seen.ids[a], seen.ids[b])


def test_up_build_on_node_1_and_plain_up_on_node_0_pass_the_preflight(seen: Seen) -> None:
    """The pair the issue met: one machine, one image, node 1 started with `up --build`, node 0 with plain `up`."""
    flags = ["--main", "127.0.0.1", *seen.flags(nnodes=2)]
    try:
        bg = nodekit("up", "--node-rank", "1", "--build", "--detach", *flags, config=seen.config, env=seen.env)
        assert bg.returncode == 0, bg.stdout[-3000:] + bg.stderr[-3000:]
        fg = nodekit("up", "--node-rank", "0", *flags, config=seen.config, env=seen.env, timeout=300)
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=seen.config, env=seen.env)
    assert fg.returncode == 0, fg.stdout[-3000:] + fg.stderr[-3000:]
    assert "nodekit preflight: ok, 2/2 nodes, identical stacks" in fg.stdout, fg.stdout
    assert "MISMATCH" not in fg.stdout + fg.stderr
