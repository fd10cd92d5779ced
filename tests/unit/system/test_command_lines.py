"""The command-line tier (python-on-whales' habit): the exact command each main operation runs, its environment
and its deadline, recorded by the fake runner (tests/fake_runner.py) with nothing executed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodekit.errors import HostToolHung, ImageError
from tests.factories import plan_here
from tests.fake_runner import FakeRunner

TIMEOUT = ["timeout", "--foreground", "--kill-after=5"]  # GNU timeout(1): the deadline of what python-on-whales runs


def node_plan(tmp_path: Path) -> object:
    from nodekit.config.settings import Settings
    from tests.factories import CPU_NODE

    (tmp_path / "train.py").write_text("print(1)\n")
    s = Settings(project_dir=tmp_path, name="demo", script="train.py", nnodes=2)
    return plan_here(s, 1, "10.0.0.5", image="nodekit/demo:0123456789ab", facts=CPU_NODE,
                          image_id=lambda ref: "sha256:" + "e" * 64)  # fmt: skip


def test_up_for_a_node_starts_its_compose_project_follows_it_and_waits_for_its_end(
    fake_runner: FakeRunner, tmp_path: Path
) -> None:
    from nodekit.backends.compose import node
    from nodekit.system import proc
    from nodekit.system.progress import RecordingReporter

    plan = node_plan(tmp_path)
    assert isinstance(plan, node.NodePlan)
    fake_runner.on("logs", stdout="step 1\nstep 2\n")
    fake_runner.on("container", "wait", stdout="0\n")
    shown: list[str] = []
    assert node.up(plan, RecordingReporter(), detach=False, on_line=shown.append) == 0
    assert shown == ["step 1", "step 2"]
    RUNNING = "{{.Names}} ({{.Status}})"
    project = ["docker", "compose", "--file", str(tmp_path / "compose" / "node-1.yaml"), "--project-name",
               "nodekit-demo-node1"]  # fmt: skip
    assert [c.cmd for c in fake_runner.calls] == [
        ["docker", "ps", "--filter", "label=com.docker.compose.project=nodekit-demo-node1", "--format", RUNNING],
        [*project, "up", "--detach", "--force-recreate"],
        [*project, "logs", "--no-color", "--follow", "--no-log-prefix"],
        ["docker", "container", "wait", "nodekit-demo-node1-train-1"],  # Compose's own name: no ps first
    ]
    # The runner starts each in a process group of its own (a signal ends compose and what it started, before
    # down), with its deadline; following and waiting last as long as the job.
    deadlines = [c.deadline for c in fake_runner.calls][1:]
    assert deadlines[0] == 600
    assert all(isinstance(d, proc.Unbounded) for d in (deadlines[1], deadlines[2]))
    assert all(c.by == "nodekit" and c.group for c in fake_runner.calls[1:])


def test_down_for_a_node_on_its_host_waits_for_the_stop_timeout_plus_the_query_deadline(
    fake_runner: FakeRunner, tmp_path: Path
) -> None:
    from nodekit.system import docker

    path = tmp_path / "compose" / "node-1.yaml"
    docker.compose_down(path, "nodekit-demo-node1", timeout=30, host="ssh://root@n1")
    down = fake_runner.only("down")
    assert down.cmd == [
        "docker", "--host", "ssh://root@n1", "compose", "--file", str(path), "--project-name",
        "nodekit-demo-node1", "down", "--remove-orphans", "--timeout", "30",
    ]  # fmt: skip
    assert down.deadline == 150 and down.group


def test_a_start_on_a_host_without_the_image_names_it_and_the_push_that_fixes_it(
    fake_runner: FakeRunner, tmp_path: Path
) -> None:
    """Rendered files say ``pull_policy: never``, so Compose asks the engine and stops at "No such image" instead of
    trying Docker Hub; nodekit makes that one line naming the image, the engine and the push, not "docker compose up
    failed for ...: pull access denied for nodekit/ddp-demo, repository does not exist"."""
    from nodekit.system import docker

    path = tmp_path / "compose" / "node-1.yaml"
    fake_runner.on("compose", "--file", stderr="Error response from daemon: No such image: nodekit/demo:abc\n",
                   returncode=1)  # fmt: skip
    fake_runner.on("version", stdout='{"Client": {"Version": "26.1.5"}, "Server": {"Version": "26.1.5"}}')
    with pytest.raises(ImageError) as e:
        docker.compose_up(path, "nodekit-demo-node1", host="ssh://root@n1")
    e.value.node = "node 1"  # as the fleet's start names it
    assert e.value.one_line() == (
        "[node 1] image nodekit/demo:abc is not on ssh://root@n1, and a start never pulls it. "
        "Fix: nodekit push nodekit/demo:abc --to ssh://root@n1"
    )


def test_a_compose_wait_on_a_host_asks_its_engine(fake_runner: FakeRunner, tmp_path: Path) -> None:
    from nodekit.system import docker

    fake_runner.on("ps", "--quiet", stdout="c0ffee\n")
    fake_runner.on("container", "wait", stdout="3\n")
    assert docker.compose_wait(None, "nodekit-demo-node1", host="ssh://root@n1") == 3
    assert [c.cmd for c in fake_runner.calls] == [
        ["docker", "--host", "ssh://root@n1", "compose", "--project-name", "nodekit-demo-node1", "ps", "--quiet",
         "--all"],
        ["docker", "--host", "ssh://root@n1", "container", "wait", "c0ffee"],
    ]  # fmt: skip


def test_a_compose_wait_for_a_service_is_one_call_where_compose_named_its_container(fake_runner: FakeRunner) -> None:
    """Compose's own name first (one docker CLI and one dial-stdio per host at a fleet's start); a project whose
    container is named otherwise (COMPOSE_COMPATIBILITY) is listed, as without a service; a lost engine is named."""
    from nodekit.errors import EngineError
    from nodekit.system import docker

    fake_runner.on("container", "wait", "nodekit-demo-node1-train-1", stdout="0\n")
    assert docker.compose_wait(None, "nodekit-demo-node1", service="train", host="ssh://root@n1") == 0
    assert [c.cmd for c in fake_runner.calls] == [
        ["docker", "--host", "ssh://root@n1", "container", "wait", "nodekit-demo-node1-train-1"]
    ]
    fake_runner.calls.clear()
    fake_runner.on("container", "wait", "nodekit-demo-node1-train-1", returncode=1,
                   stderr="Error response from daemon: No such container: nodekit-demo-node1-train-1\n")  # fmt: skip
    fake_runner.on("ps", "--quiet", stdout="c0ffee\n")
    fake_runner.on("container", "wait", "c0ffee", stdout="7\n")
    assert docker.compose_wait(None, "nodekit-demo-node1", service="train", host="ssh://root@n1") == 7
    assert [c.cmd[-1] for c in fake_runner.calls] == ["nodekit-demo-node1-train-1", "--all", "c0ffee"]
    fake_runner.on("container", "wait", "nodekit-demo-node1-train-1", returncode=255,
                   stderr="error during connect: ssh: connection closed\n")  # fmt: skip
    with pytest.raises(EngineError, match="lost ssh://root@n1 while waiting for nodekit-demo-node1: error during"):
        docker.compose_wait(None, "nodekit-demo-node1", service="train", host="ssh://root@n1")


def test_a_layer_is_built_by_buildx_offline_and_streamed_back_as_a_tar(fake_runner: FakeRunner, tmp_path: Path) -> None:
    from nodekit.system import docker

    progress = "#1 [internal] load build definition\n#1 DONE 0.0s\n"
    fake_runner.on("buildx", "build", stdout=b"layer tar bytes", stderr=progress)
    lines: list[str] = []
    got = b"".join(docker.buildx_export(tmp_path / "ctx", dockerfile=tmp_path / "Dockerfile", target="layer-packages",
                                        build_contexts={"wheels": tmp_path / "w"}, build_args={"NODEKIT_X": "1"},
                                        on_line=lines.append))  # fmt: skip
    assert got == b"layer tar bytes"
    assert lines == ["#1 [internal] load build definition", "#1 DONE 0.0s"]
    assert fake_runner.only("buildx").cmd == [
        "docker", "buildx", "build", "--file", str(tmp_path / "Dockerfile"), "--target", "layer-packages",
        "--network=none", "--provenance=false", "--progress=plain", "--output", "type=tar,dest=-", "--build-context",
        f"wheels={tmp_path / 'w'}", "--build-arg", "NODEKIT_X=1", str(tmp_path / "ctx"),
    ]  # fmt: skip
    fake_runner.on("buildx", "build", stderr="#5 ERROR: process did not complete successfully\n", returncode=1)
    with pytest.raises(docker.BuildError, match="image build failed: #5 ERROR: process did not complete"):
        list(docker.buildx_export(tmp_path / "ctx", dockerfile=tmp_path / "Dockerfile", target="t", build_contexts={},
                                  build_args={}))  # fmt: skip


def test_the_base_probe_is_one_offline_docker_run_of_sh_with_the_script_in_its_environment(
    fake_runner: FakeRunner, tmp_path: Path
) -> None:
    from nodekit.config.settings import Settings
    from nodekit.image import probe
    from nodekit.system import docker

    base = docker.ImageInfo(id="sha256:" + "b" * 64, tags=("nodekit/base:bookworm",), labels={}, size=1)
    settings = Settings(project_dir=tmp_path, name="p", script="train.py")
    fake_runner.on("run", stdout="nodekit-probe: no python\n")
    assert probe.probe_base(settings, base=base, refresh=True).kind == "none"
    run = fake_runner.only("run")
    name = run.cmd[4]
    assert run.cmd == ["docker", "run", "--rm", "--name", name, "--label", f"org.nodekit.probe={name}", "--network",
                       "none", "--pull", "never", "--env", "NODEKIT_PROBE", "--entrypoint", "sh", base.id, "-c",
                       probe.PROBE_SHELL]  # fmt: skip
    assert name.startswith("nodekit-probe-") and run.deadline == probe.PROBE_TIMEOUT == 60
    assert run.env is not None and run.env["NODEKIT_PROBE"] == probe.PROBE_SCRIPT
    # A probe its deadline stops: its container is removed (under the engine's query deadline), one line says so;
    # then once more by its label, for a create the engine finished after its client was killed.
    fake_runner.on("run", hang=True)
    with pytest.raises(ImageError, match=r"^probing sha256:b+ did not finish within 60 s"):
        probe.probe_base(settings, base=base, refresh=True)
    run, rm, ps = fake_runner.calls[-3:]
    assert rm.cmd == ["docker", "rm", "-f", run.cmd[4]] and rm.deadline == 120
    assert ps.cmd == ["docker", "ps", "--all", "--quiet", "--filter", f"label=org.nodekit.probe={run.cmd[4]}"]


def test_a_signal_during_the_base_probe_removes_its_container(
    fake_runner: FakeRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: Ctrl-C during `nodekit build`'s base probe left a `Created` container with no label to find it
    by (the killed docker client never started it, so --rm never applied). Now any signal removes it."""
    import os
    import signal
    import time

    from nodekit.config.settings import Settings
    from nodekit.image import probe
    from nodekit.system import docker, proc
    from nodekit.system.docker import containers

    base = docker.ImageInfo(id="sha256:" + "b" * 64, tags=("nodekit/base:bookworm",), labels={}, size=1)
    settings = Settings(project_dir=tmp_path, name="p", script="train.py")
    fake_runner.on("ps", stdout="c0ffee\n")  # the create the engine finished after its client was killed
    real_run = proc.run

    def interrupted_run(argv: list[str], **kw: Any) -> proc.Result:
        done = real_run(argv, **kw)
        if "run" in argv:  # Ctrl-C while `docker run` creates the container
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        return done

    monkeypatch.setattr(containers.proc, "run", interrupted_run)
    with pytest.raises(proc.Interrupted), proc.stopping():
        probe.probe_base(settings, base=base, refresh=True)
    run = fake_runner.only("run")
    name = run.cmd[4]
    assert [c.cmd[1:] for c in fake_runner.calls[1:]] == [
        ["rm", "-f", name], ["ps", "--all", "--quiet", "--filter", f"label=org.nodekit.probe={name}"],
        ["rm", "-f", "c0ffee"],
    ]  # fmt: skip


def test_a_push_sends_docker_save_into_docker_load_over_ssh(
    fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodekit import ship
    from nodekit.ship import fanout
    from nodekit.system import docker
    from nodekit.system.progress import RecordingReporter
    from tests.factories import SRC, state

    monkeypatch.setattr(fanout, "_verify", lambda src, step: None)
    archive = b"an image archive " * 1000
    fake_runner.on("image", "save", stdout=archive)
    plan = ship.plan_push(SRC, [state("n1", "ssh://root@n1")], compress="none")
    ship.push(plan, RecordingReporter(), relay="never")
    save, load = fake_runner.only("save"), fake_runner.only("load")
    assert save.cmd == ["docker", "image", "save", SRC.ref]
    assert load.cmd == ["docker", "--host", "ssh://root@n1", "image", "load", "--quiet"]
    assert bytes(load.written) == archive
    # Each stops once it stands still for 60 s (a stall deadline: a large image on a slow disk is never cut off
    # while it moves); the load's answer after the last byte has its own (ship/outcome.py).
    stall = ship.relay.proc.Stall(60.0)
    assert save.deadline == ship.relay.proc.Stall(docker.streams.SAVE_STALL_S) == stall
    assert load.deadline == ship.relay.proc.Stall(docker.streams.LOAD_STALL_S) == stall
    assert save.group and load.group  # a signal ends each with what it started (the docker CLI's ssh)


def test_host_facts_are_one_sh_script_and_a_hung_nvidia_smi_in_it_is_one_line_exit_2(fake_runner: FakeRunner) -> None:
    """The facts script nodekit up runs here is the one nodekit run sends over SSH (nodekit/system/host/facts.py);
    nvidia-smi in it has its own 20 s, the script the rest."""
    from nodekit.system.host import facts

    fake_runner.on("sh", stdout="gpu=NVIDIA H100 80GB HBM3\ngpu=NVIDIA H100 80GB HBM3\nmemlock_kb=unlimited\n")
    assert facts.run_script().facts.gpu_models == ("NVIDIA H100 80GB HBM3",) * 2
    call = fake_runner.only("sh")
    assert call.cmd == ["sh", "-c", facts.facts_script()] and call.deadline == 30
    fake_runner.on("sh", stdout="nvidia_smi=hung\n")
    with pytest.raises(HostToolHung) as e:
        facts.run_script()
    assert e.value.exit_code == 2
    assert e.value.one_line().startswith("nvidia-smi did not finish within 20 s and was stopped (it hung). Fix: ")


def test_a_fleet_host_check_is_one_batch_mode_ssh_within_38_s(fake_runner: FakeRunner) -> None:
    from nodekit.backends.fleet import remote
    from nodekit.backends.fleet.hosts import parse_host

    host = parse_host("ssh://alice@10.0.0.6:2222", 1)
    fake_runner.on("ssh", stdout="gpu=A\ngpu=A\nmemlock_kb=unlimited\nstack_kb=8192\nhost=n6\nlisten=0100007F:1F90\n")
    got = remote.gather(host, paths=["/data/x"])
    assert isinstance(got, remote.Gathered) and got.hostname == "n6" and got.facts.gpu_count == 2
    call = fake_runner.only("ssh")
    assert call.cmd[:-1] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=8", "-o", "ServerAliveInterval=10",
                             "-o", "ServerAliveCountMax=3", "-p", "2222", "-l", "alice", "--", "10.0.0.6"]  # fmt: skip
    # The connection (8 s), then the facts script there: nvidia-smi's 20 s and the rest's 10.
    assert call.cmd[-1] == remote.facts_script(["/data/x"]) and call.deadline == 38
    fake_runner.on("ssh", hang=True)
    problem = remote.gather(host)
    assert isinstance(problem, remote.Problem) and problem.what == "SSH did not answer within 38 s"
    fake_runner.on("ssh", stderr="alice@10.0.0.6: Permission denied (publickey).\n", returncode=255)
    problem = remote.gather(host)
    assert isinstance(problem, remote.Problem) and problem.fix.startswith("ssh-copy-id alice@10.0.0.6")


def test_a_relay_lends_no_agent_sets_up_every_node_first_and_its_hop_uses_only_the_push_key(
    fake_runner: FakeRunner,
) -> None:
    """No ``ssh -A`` (the user's agent forwarded down the tree): every ssh of a relay says ForwardAgent=no, and
    before the stream each node is set up (its directory and hop key) and the second node authorises the key the
    first made for it; when the stream ends, both are cleaned."""
    from nodekit.ship import hopkeys, relay

    key = "AAAAC3NzaC1lZDI1NTE5AAAAI" + "Q" * 43
    fake_runner.on("ssh", stdout="nodekit-relay-setup /tmp/nodekit-relay.Ab12Cd\n")
    fake_runner.on("--", "n1", stdout=f"nodekit-relay-setup /tmp/nodekit-relay.Ab12Cd\n"
                                      f"nodekit-relay-dial 0 ssh-ed25519 {key} 10.0.0.7\n")  # fmt: skip
    hops = [relay.Hop(name=n, endpoint=f"ssh://root@{n}:2201", user="root", hostname=n, port=2201, alias=n,
                      known_hosts=f"{n} ssh-ed25519 AAAA\n") for n in ("n1", "n2")]  # fmt: skip
    sink = relay.RelaySink(hops)
    sink.write(b"image bytes")
    sink.finish()
    calls = fake_runner.calls
    assert all(c.cmd[0] == "ssh" for c in calls) and len(calls) == 6
    lend_nothing = ["-o", "BatchMode=yes", "-o", "ForwardAgent=no", "-o", "ClearAllForwardings=yes",
                    "-o", "ConnectTimeout=10"]  # fmt: skip
    where = ["-p", "2201", "-l", "root", "--"]
    setups, authorize, stream, ends = calls[:2], calls[2], calls[3], calls[4:]
    assert sorted(c.cmd[-2] for c in setups) == ["n1", "n2"] and authorize.cmd[-2] == "n2"
    for c in [*setups, authorize, *ends]:
        assert c.cmd[1:-2] == [*lend_nothing, *where] and c.deadline == hopkeys.CALL_S
    n1 = next(c for c in setups if c.cmd[-2] == "n1")
    assert n1.cmd[-1] == hopkeys.setup_command(hops[0], hops[1:], relay.RELAY_SCRIPT)
    entry = hopkeys.entry_command("/tmp/nodekit-relay.Ab12Cd")
    line = f'restrict,from="10.0.0.7",command="{entry}" ssh-ed25519 {key} nodekit-relay'
    command = hopkeys.authorize_command(line, hopkeys.KEY_LIFETIME_S, "/tmp/nodekit-relay.Ab12Cd", key)
    assert authorize.cmd[-1] == command
    assert stream.cmd == ["ssh", *lend_nothing, "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
                          *where, "n1", entry]  # fmt: skip
    # The tree's one stall deadline: the stream stops once a write into it stands still that long.
    assert stream.deadline == relay.proc.Stall(relay.STALL_S) and bytes(stream.written) == b"image bytes"
    assert sorted((c.cmd[-2], c.cmd[-1]) for c in ends) == [
        ("n1", hopkeys.end_command("/tmp/nodekit-relay.Ab12Cd", "", kill=False)),
        ("n2", hopkeys.end_command("/tmp/nodekit-relay.Ab12Cd", key, kill=False)),
    ]
    # The hop a node makes to each node it feeds: none of the node's ssh config, only the key made for that hop of
    # the push, no agent, nothing forwarded, only the host key the head vouches for, AES-GCM first; its files named
    # inside the relay directory the step runs in, never by that directory's path.
    hop_line = next(ln.strip() for ln in relay.RELAY_SCRIPT.splitlines() if ln.strip().startswith("ssh "))
    assert hop_line == (
        "ssh -F /dev/null -i ./c$j/key -o IdentitiesOnly=yes -o IdentityAgent=none "
        "-o Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,"
        "aes192-ctr,aes256-ctr -o BatchMode=yes "
        "-o ForwardAgent=no -o ClearAllForwardings=yes "
        "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=./c$j/known_hosts "
        '-o GlobalKnownHostsFile=/dev/null -o HostKeyAlias="$alias" -o CheckHostIP=no -o ConnectTimeout=10 '
        '-o ServerAliveInterval=10 -o ServerAliveCountMax=3 -p "$port" -- "$dest" nodekit-relay < ./c$j/fifo &'
    )


def test_a_push_shares_ssh_connections_through_the_childrens_environment_not_os_environ(
    fake_runner: FakeRunner,
) -> None:
    """nodekit/ship/mux.py leaves this process's PATH alone for the length of a push."""
    import os

    from nodekit import ship
    from nodekit.system import docker

    before = dict(os.environ)
    with ship.SharedSsh() as shared:
        assert os.environ == before
        assert shared.dir is not None and (shared.dir / "ssh").is_file()
        path = f"{shared.dir}:{os.environ['PATH']}"
        docker.tag_image("sha256:abc", "nodekit/demo:1", "ssh://root@n1")  # python-on-whales starts it
        docker.LoadSink("ssh://root@n1").finish()  # the runner starts it
    pow_call, load = fake_runner.calls
    assert pow_call.by == "python-on-whales"
    assert pow_call.cmd == ["env", f"PATH={path}", "timeout", "--foreground", "--kill-after=5", "120", "docker",
                            "--host", "ssh://root@n1", "image", "tag", "sha256:abc", "nodekit/demo:1"]  # fmt: skip
    assert load.cmd == ["docker", "--host", "ssh://root@n1", "image", "load", "--quiet"]
    assert load.env is not None and load.env["PATH"] == path
    assert os.environ == before and not shared.dir
