"""The command-line tier (python-on-whales' habit): the exact command each main operation runs, its environment
and its deadline, recorded by the fake runner (tests/fake_runner.py) with nothing executed."""

from __future__ import annotations

import pytest

from nodekit.errors import HostToolHung
from tests.fake_runner import FakeRunner


def test_nvidia_smi_lists_the_gpus_within_20_s_and_a_hang_is_one_line_exit_2(fake_runner: FakeRunner) -> None:
    from nodekit.host import facts

    fake_runner.on("nvidia-smi", stdout="NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n")
    assert facts.nvidia_smi_models() == ["NVIDIA H100 80GB HBM3"] * 2
    call = fake_runner.only("nvidia-smi")
    assert call.cmd == ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"] and call.deadline == 20
    fake_runner.on("nvidia-smi", hang=True)
    with pytest.raises(HostToolHung) as e:
        facts.nvidia_smi_models()
    assert e.value.exit_code == 2 and fake_runner.calls[-1].signals == [9]
    assert e.value.one_line().startswith("nvidia-smi did not finish within 20 s and was stopped (it hung). Fix: ")


def test_a_fleet_host_check_is_one_batch_mode_ssh_within_28_s(fake_runner: FakeRunner) -> None:
    from nodekit.fleet import remote
    from nodekit.fleet.hosts import parse_host

    host = parse_host("ssh://alice@10.0.0.6:2222", 1)
    fake_runner.on("ssh", stdout="gpus=2\nmemlock_kb=unlimited\nstack_kb=8192\nhost=n6\nlisten=0100007F:1F90\n")
    got = remote.gather(host, paths=["/data/x"])
    assert isinstance(got, remote.Gathered) and got.hostname == "n6" and got.facts.gpu_count == 2
    call = fake_runner.only("ssh")
    assert call.cmd[:-1] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=8", "-p", "2222", "-l", "alice",
                             "--", "10.0.0.6"]  # fmt: skip
    assert call.cmd[-1] == remote.facts_script(["/data/x"]) and call.deadline == 28
    fake_runner.on("ssh", hang=True)
    problem = remote.gather(host)
    assert isinstance(problem, remote.Problem) and problem.what == "SSH did not answer within 30 s"
    fake_runner.on("ssh", stderr="alice@10.0.0.6: Permission denied (publickey).\n", returncode=255)
    problem = remote.gather(host)
    assert isinstance(problem, remote.Problem) and problem.fix.startswith("ssh-copy-id alice@10.0.0.6")


def test_the_relays_ssh_hop_forwards_the_agent_keeps_alive_and_never_shares_a_connection(
    fake_runner: FakeRunner,
) -> None:
    from nodekit.ship import relay
    from nodekit.ship.mux import NO_MUX

    hops = [relay.Hop(name=n, endpoint=f"ssh://root@{n}:2201", user="root", hostname=n, port=2201, alias=n,
                      known_hosts=f"{n} ssh-ed25519 AAAA\n") for n in ("n1", "n2")]  # fmt: skip
    sink = relay.RelaySink(hops, agent_socket="/tmp/agent.sock")
    sink.write(b"image bytes")
    sink.finish()
    call = fake_runner.only("ssh")
    assert call.cmd == ["ssh", "-A", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
                        "-o", "ServerAliveCountMax=3", "-p", "2201", "-l", "root", "--", "n1",
                        relay.chain_command(hops)]  # fmt: skip
    assert call.env is not None and call.env[NO_MUX] == "1" and call.env["SSH_AUTH_SOCK"] == "/tmp/agent.sock"
    assert isinstance(call.deadline, relay.proc.Unbounded) and bytes(call.written) == b"image bytes"
    # The hop a node makes to the next one: the same options, and only the host key the head vouches for.
    hop_line = next(ln.strip() for ln in relay.RELAY_SCRIPT.splitlines() if ln.strip().startswith("ssh "))
    assert hop_line == (
        'ssh -A -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$d/known_hosts" '
        '-o GlobalKnownHostsFile=/dev/null -o HostKeyAlias="$alias" -o CheckHostIP=no -o ConnectTimeout=10 '
        '-o ServerAliveInterval=10 -o ServerAliveCountMax=3 -p "$port" -- "$dest" \\'
    )


def test_a_push_shares_ssh_connections_through_the_childrens_environment_not_os_environ(
    fake_runner: FakeRunner,
) -> None:
    """Before, nodekit/ship/mux.py rewrote this process's PATH for the length of a push."""
    import os

    from nodekit import docker, ship

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
