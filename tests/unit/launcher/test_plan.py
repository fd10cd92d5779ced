"""What the launcher execs, built by a pure function from the environment: no torch, no process."""

from __future__ import annotations

import pytest

from nodekit.launcher.config import parse_env
from nodekit.launcher.plan import (
    ENV_MODE_UNSET,
    CommandError,
    Rendezvous,
    exec_plan,
    fallback_run_id,
    missing_target,
    parse_command,
    start_line,
)
from tests.factories import LAUNCH_ENV


def test_torchrun_argv_for_a_script() -> None:
    plan = exec_plan(
        parse_env(LAUNCH_ENV), parse_command(["train.py", "--epochs", "3"]), torchrun="/opt/venv/bin/torchrun"
    )
    assert list(plan.argv) == [
        "/opt/venv/bin/torchrun",
        "--nnodes", "2",
        "--node-rank", "1",
        "--nproc-per-node", "4",
        "--master-addr", "10.0.0.5",
        "--master-port", "29500",
        "--max-restarts", "0",
        "--rdzv-conf", "timeout=180",
        "train.py", "--epochs", "3",
    ]  # fmt: skip
    assert plan.set_env == (("NODEKIT_EXIT_GUARD", "1"), ("NODEKIT_WORKER_DIR", "/tmp/nodekit-workers"))
    assert plan.unset_env == ()


def test_torchrun_argv_for_a_module() -> None:
    plan = exec_plan(parse_env(LAUNCH_ENV), parse_command(["-m", "pkg.train", "--x"]))
    assert plan.argv[0] == "torchrun"
    tail = list(plan.argv[plan.argv.index("--max-restarts") :])
    assert tail == ["--max-restarts", "0", "--rdzv-conf", "timeout=180", "-m", "pkg.train", "--x"]


def test_restarts_use_the_c10d_rendezvous_hosted_by_node_0_with_main_s_run_id() -> None:
    """Only c10d restarts every node's workers when one node's agent restarts (static cannot): same endpoint as
    static, node 0 hosting it (never guessed: on one machine every node's address matches), the run id from main's
    verdict, this node's address for the workers' store, and the rendezvous timeout as the join and connect bound."""
    rdzv = Rendezvous(run_id="5f0c2a9e41d3b7c8", local_addr="10.0.0.6")
    for rank, host in (("1", "0"), ("0", "1")):
        cfg = parse_env({**LAUNCH_ENV, "NODE_RANK": rank, "NODEKIT_MAX_RESTARTS": "3"})
        plan = exec_plan(cfg, parse_command(["train.py", "8", "1"]), torchrun="torchrun", rendezvous=rdzv)
        assert list(plan.argv) == [
            "torchrun",
            "--nnodes", "2",
            "--nproc-per-node", "4",
            "--max-restarts", "3",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "10.0.0.5:29500",
            "--rdzv-id", "5f0c2a9e41d3b7c8",
            "--rdzv-conf", f"join_timeout=180,read_timeout=60,is_host={host}",
            "--local-addr", "10.0.0.6",
            "train.py", "8", "1",
        ]  # fmt: skip
        assert "--node-rank" not in plan.argv and "--master-addr" not in plan.argv
        # A new store for the workers of every round: torch's shared one keeps the keys of the round before.
        assert plan.environ({})["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    static = exec_plan(parse_env(LAUNCH_ENV), parse_command(["train.py"]))
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in static.environ({})


def test_c10d_without_preflight_ipv6_and_the_other_torchrun_modes() -> None:
    cfg = parse_env({**LAUNCH_ENV, "MASTER_ADDR": "fd00::5", "NODEKIT_MAX_RESTARTS": "1", "NODEKIT_NAME": "job"})
    plan = exec_plan(cfg, parse_command(["train.py"]))
    argv = list(plan.argv)
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd00::5]:29500"
    assert argv[argv.index("--rdzv-id") + 1] == fallback_run_id(cfg) == "nodekit-job-29500"
    assert "--local-addr" not in argv
    # Without preflight a node may start long before main: its first connection waits the rendezvous timeout.
    no_preflight = parse_env({**LAUNCH_ENV, "NODEKIT_MAX_RESTARTS": "1", "NODEKIT_PREFLIGHT": "0"})
    alone = exec_plan(no_preflight, parse_command(["t.py"]))
    assert "join_timeout=180,read_timeout=180,is_host=0" in alone.argv
    for mode in ("fabric", "torch.distributed.launch"):
        other = exec_plan(parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": mode, "NODEKIT_MAX_RESTARTS": "2"}),
                          parse_command(["train.py"]), rendezvous=Rendezvous("r1", "10.0.0.6"))  # fmt: skip
        assert other.argv[other.argv.index("--rdzv-backend") + 1] == "c10d"
        assert other.argv[other.argv.index("--rdzv-id") + 1] == "r1"
    assert (
        "--local-rank=${local_rank}"
        in exec_plan(
            parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": "torch.distributed.launch", "NODEKIT_MAX_RESTARTS": "2"}),
            parse_command(["train.py"]),
        ).argv
    )
    env = exec_plan(parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": "env", "NODEKIT_MAX_RESTARTS": "2"}),
                    parse_command(["train.py"]), python="python")  # fmt: skip
    assert env.argv == ("python", "train.py")  # no torchrun: nothing restarts the framework's workers


def test_env_mode_runs_python_directly_without_per_process_variables() -> None:
    cfg = parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": "env"})
    plan = exec_plan(cfg, parse_command(["train.py", "--devices", "4"]), python="/opt/venv/bin/python")
    assert plan.argv == ("/opt/venv/bin/python", "train.py", "--devices", "4")
    env = plan.environ({**LAUNCH_ENV, "LOCAL_RANK": "0", "RANK": "3", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert not set(ENV_MODE_UNSET) & set(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["NODE_RANK"], env["WORLD_SIZE"]) == (
        "10.0.0.5",
        "29500",
        "1",
        "8",
    )
    module = exec_plan(cfg, parse_command(["-m", "pkg.train"]), python="python")
    assert module.argv == ("python", "-m", "pkg.train")


def test_fractional_timeout_rounds_for_torchrun() -> None:
    plan = exec_plan(parse_env({**LAUNCH_ENV, "NODEKIT_RDZV_TIMEOUT": "0.4"}), parse_command(["t.py"]))
    assert "timeout=1" in plan.argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no training command"),
        (["-m"], "-m needs a module name"),
        (["-m", "--flag"], "-m needs a module name"),
        (["--nproc-per-node", "2", "train.py"], "unexpected option '--nproc-per-node'"),
    ],
)
def test_bad_commands(argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        parse_command(argv)


def test_missing_script_is_named_with_the_fix() -> None:
    cmd = parse_command(["trian.py"])
    problem = missing_target(cmd, "/workspace", exists={"/workspace/trian.py": False})
    assert problem is not None and "'trian.py' not found in /workspace" in problem and "nodekit build" in problem
    assert missing_target(cmd, "/workspace", exists={"/workspace/trian.py": True}) is None
    assert missing_target(parse_command(["-m", "pkg"]), "/workspace", exists={}) is None


def test_start_line() -> None:
    assert start_line(parse_env(LAUNCH_ENV)) == (
        "nodekit ddp-demo: node 1/2 | 4 proc/node | world 8 | main 10.0.0.5:29500 | iface eth0 | "
        "image 3f2a9c1b0d4e | torchrun"
    )
    bare = {k: LAUNCH_ENV[k] for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "NPROC_PER_NODE")}
    assert start_line(parse_env(bare)) == (
        "nodekit: node 1/2 | 4 proc/node | world counted in preflight | main 10.0.0.5:29500 | iface auto | "
        "image unknown | torchrun"
    )


def test_exit_guard_is_on_for_the_jobs_processes_unless_the_node_said_0() -> None:
    for mode in ("torchrun", "env"):
        on = exec_plan(parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": mode}), parse_command(["train.py"]))
        assert on.environ({})["NODEKIT_EXIT_GUARD"] == "1"
        off = exec_plan(
            parse_env({**LAUNCH_ENV, "NODEKIT_LAUNCHER": mode, "NODEKIT_EXIT_GUARD": "0"}), parse_command(["train.py"])
        )
        assert off.environ({"NODEKIT_EXIT_GUARD": "0"})["NODEKIT_EXIT_GUARD"] == "0"


def test_every_style_but_env_keeps_the_launcher_for_the_whole_job() -> None:
    """What decides whether node 0 hosts the store, the peer watchdog runs and the link check can run beside the
    job's start: torchrun in the launcher's process and mpirun's watched processes keep it; env execs the command."""
    from nodekit.launcher.contract import LAUNCH_MODES
    from nodekit.launcher.plan import Runs, style

    assert {m: style(m).runs for m in LAUNCH_MODES} == {
        "torchrun": Runs.TORCHRUN, "fabric": Runs.TORCHRUN, "env": Runs.EXEC,
        "torch.distributed.launch": Runs.TORCHRUN, "mpirun": Runs.CHILDREN,
    }  # fmt: skip
    assert {m: style(m).runs.stays for m in LAUNCH_MODES} == {
        "torchrun": True, "fabric": True, "env": False, "torch.distributed.launch": True, "mpirun": True,
    }  # fmt: skip
