"""The job secret: made once per project (or taken from the shell), rendered into every node's environment, never
printed; main's preflight store (nodekit's own, on a real loopback port here) refuses a node or a process without
it, and a node without it refuses main."""

from __future__ import annotations

import multiprocessing
import re
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import nodekit.launcher.main as launcher_main
from nodekit.cli.app import app
from nodekit.errors import ConfigError
from nodekit.job import secret
from nodekit.launcher.config import LaunchConfig
from nodekit.launcher.preflight.exchange import SecretMismatch, open_store
from tests.factories import BEHAVIOURS, cfg, facts, hostile, quiet, wait_for
from tests.ports import quiet_ports

S1 = "a" * 32
S2 = "b" * 32


def test_the_project_secret_is_made_once_0600_and_the_shell_wins(tmp_path: Path) -> None:
    first = secret.resolve({}, tmp_path)
    path = tmp_path / ".nodekit" / "job-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret.resolve({}, tmp_path) == first and len(first) == 32
    assert secret.resolve({"NODEKIT_JOB_SECRET": S1}, tmp_path) == S1
    assert secret.new_secret() != secret.new_secret()
    with pytest.raises(ConfigError, match="not a usable job secret"):
        secret.resolve({"NODEKIT_JOB_SECRET": "short"}, tmp_path)


def test_a_dry_run_creates_no_secret_file(tmp_path: Path) -> None:
    assert len(secret.for_node({}, tmp_path, create=False)) == 32
    assert not (tmp_path / ".nodekit").exists()


def test_a_secret_file_that_is_a_link_is_refused_and_what_it_points_at_is_never_the_secret(tmp_path: Path) -> None:
    """A cloned repository can carry ``.nodekit/job-secret`` as a link to a file of the user's own (0600, theirs: the
    mode and owner checks pass it): its text must not become the job secret every node gets."""
    own = tmp_path / "id_ed25519"
    own.write_text("c" * 32 + "\n")
    own.chmod(0o600)
    (tmp_path / ".nodekit").mkdir()
    (tmp_path / ".nodekit" / "job-secret").symlink_to(own)
    with pytest.raises(ConfigError, match="symbolic link") as refused:
        secret.resolve({}, tmp_path)
    assert "c" * 32 not in str(refused.value) and own.read_text() == "c" * 32 + "\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_MASTER_PORT", "NODEKIT_NAME", "NODEKIT_JOB_SECRET"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "sec"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_node_file_carries_the_same_secret_and_no_output_shows_it(project: Path) -> None:
    runner = CliRunner()
    for rank in (0, 1):
        made = runner.invoke(app, ["compose", "--node-rank", str(rank), "--main", "127.0.0.1", "--image", "x:y"])
        assert made.exit_code == 0, made.stderr
    value = (project / ".nodekit" / "job-secret").read_text().strip()
    for rank in (0, 1):
        path = project / "compose" / f"node-{rank}.yaml"
        env = yaml.safe_load(path.read_text())["services"]["train"]["environment"]
        assert env["NODEKIT_JOB_SECRET"] == value
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for command in ("compose", "up"):
        shown = runner.invoke(app, [command, "--dry-run", "--node-rank", "1", "--main", "127.0.0.1", "--image", "x:y"])
        assert shown.exit_code == 0, shown.stderr
        assert value not in shown.stdout and "NODEKIT_JOB_SECRET: ********" in shown.stdout


def free_port() -> int:
    """A port for a store this test opens: not from the ephemeral range, which other tests' connections draw on."""
    return quiet_ports(1)[0]


def run_preflight(
    monkeypatch: pytest.MonkeyPatch,
    secrets_by_rank: dict[int, str],
    timeout: float = 3.0,
    hostile_behaviours: tuple[str, ...] = (),
) -> tuple[dict[int, int], dict[int, Any]]:
    """Every node's ``preflight()`` in a thread, through the real store on a free loopback port; while
    ``hostile_behaviours`` is set, clients without the secret hammer main's port with them. Returns the exit codes
    and each node's store (main's is the hosted one)."""
    port = free_port()
    stores: dict[int, Any] = {}

    def opened(c: LaunchConfig, *args: Any, **kwargs: Any) -> Any:
        stores[c.node_rank] = open_store(c, *args, **kwargs)
        return stores[c.node_rank]

    monkeypatch.setattr(launcher_main, "open_store", opened)
    monkeypatch.setattr(launcher_main, "gather", lambda c, addr: facts(c.node_rank))
    codes: dict[int, int] = {}
    env = {"MASTER_ADDR": "127.0.0.1", "NODEKIT_PREFLIGHT_PORT": str(port)}

    def node(rank: int) -> None:
        c = cfg(rank, len(secrets_by_rank), timeout, NODEKIT_JOB_SECRET=secrets_by_rank[rank], **env)
        codes[rank], _ = launcher_main.preflight(c, quiet())

    stop = threading.Event()

    def attack() -> None:
        held: list[socket.socket] = []
        i = 0
        while not stop.is_set():
            hostile(port, hostile_behaviours[i % len(hostile_behaviours)], held)
            i += 1
        for sock in held:
            sock.close()

    threads = {r: threading.Thread(target=node, args=(r,)) for r in secrets_by_rank}
    threads[0].start()
    assert wait_for(lambda: 0 in stores)  # main hosts first, as in most starts
    attacker = threading.Thread(target=attack)
    if hostile_behaviours:
        attacker.start()  # the attack is under way before any worker arrives, and lasts until every node is done
        assert wait_for(lambda: stores[0].stats().refused + stores[0].stats().evicted >= 100, within=20)
    for r in secrets_by_rank:
        if r:
            threads[r].start()
    for t in threads.values():
        t.join(timeout=60)
    stop.set()
    if hostile_behaviours:
        attacker.join(timeout=10)
    return codes, stores


def test_nodes_sharing_the_secret_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    codes, _ = run_preflight(monkeypatch, {0: S1, 1: S1})
    assert codes == {0: 0, 1: 0}


def test_a_node_with_another_secret_is_refused_at_once_and_never_joins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    codes, stores = run_preflight(monkeypatch, {0: S1, 1: S2}, timeout=2.0)
    assert codes == {0: 18, 1: 17}  # main names node 1 as never arrived; node 1 knows why
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "another NODEKIT_JOB_SECRET than this node's" in err and "node(s) 1 never arrived" in err
    assert 1 not in stores, "a node without the secret got a store connection"
    assert not stores[0].check(["nodekit/facts/1"]) and not stores[0].check(["nodekit/claim/1"])


def test_main_names_a_node_with_another_secret_at_once_and_changes_nothing_else() -> None:
    """Issue 46: a worker with its own .nodekit/job-secret (a fresh clone) left main waiting out rdzv_timeout and
    ending with "node(s) 1 never arrived". The worker now tells main its rank in place of its proof: main names it
    at once with the fix, keeps waiting (the notice is unauthenticated: nothing else changes), and says it again
    last."""
    from nodekit.launcher.preflight.exchange import Clock, run_main

    port = free_port()
    main_cfg = cfg(0, 2, 4.0, NODEKIT_PREFLIGHT_PORT=str(port), NODEKIT_JOB_SECRET=S1)
    main = open_store(main_cfg, 5)
    lines: list[tuple[float, str]] = []
    clock = Clock(log=lambda line: lines.append((time.monotonic(), line)))
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(run_main(main, main_cfg, facts(0), clock)))
    try:
        t.start()
        worker = cfg(1, 2, 4.0, MASTER_ADDR="127.0.0.1", NODEKIT_PREFLIGHT_PORT=str(port), NODEKIT_JOB_SECRET=S2)
        refused = time.monotonic()
        with pytest.raises(SecretMismatch):
            open_store(worker, 5, connect_s=2)
        said = "nodekit preflight: node 1 (127.0.0.1) reached main with another job secret: copy .nodekit/job-secret"
        assert wait_for(lambda: any(said in line for _, line in lines), within=3), lines
        assert next(at for at, line in lines if said in line) - refused < 2
        assert not main.check(["nodekit/facts/1"]) and not main.check(["nodekit/claim/1"])
        t.join(timeout=30)
        assert done and done[0].verdict.missing == (1,), "main waits it out, names node 1 missing"
        assert "node(s) 1 reached main with another job secret and could not join" in lines[-1][1]
    finally:
        main.close()


def test_a_stranger_s_wrong_secret_notices_are_bounded_and_a_forged_proof_is_not_one() -> None:
    from nodekit.launcher.store.auth import notice_rank, wrong_secret_notice
    from nodekit.launcher.store.server import MAX_NOTICES

    assert notice_rank(wrong_secret_notice(7)) == 7 and notice_rank(b"\x00" * 32) is None
    assert notice_rank(wrong_secret_notice(7)[:-1] + b"x") is None
    main = open_store(cfg(0, 2, 5.0, NODEKIT_PREFLIGHT_PORT=str(free_port()), NODEKIT_JOB_SECRET=S1), 5)
    try:
        for rank in range(MAX_NOTICES + 20):
            with socket.create_connection(("127.0.0.1", main.port), timeout=5) as sock:
                from nodekit.launcher.store.auth import CLIENT_HELLO_LEN, MAGIC, SERVER_HELLO_LEN

                sock.sendall(MAGIC + b"n" * (CLIENT_HELLO_LEN - len(MAGIC)))
                got = b""
                while len(got) < SERVER_HELLO_LEN:
                    got += sock.recv(SERVER_HELLO_LEN - len(got))
                sock.sendall(wrong_secret_notice(rank))
        assert wait_for(lambda: len(main.wrong_secret()) == MAX_NOTICES, within=5)
        assert main.stats().sessions == 0 and not main.check(["nodekit/facts/1"])
    finally:
        main.close()


@pytest.mark.parametrize("behaviours", [BEHAVIOURS, ("guess",), ("partial", "silent")])
def test_a_client_without_the_secret_changes_no_nodes_verdict_or_exit_code(
    monkeypatch: pytest.MonkeyPatch, behaviours: tuple[str, ...]
) -> None:
    """Hammering main's port during preflight: garbage, oversized lengths, made-up proofs, handshakes that never
    finish, thousands of connections. Both nodes still pass with main's verdict."""
    codes, stores = run_preflight(monkeypatch, {0: S1, 1: S1}, timeout=20.0, hostile_behaviours=behaviours)
    assert codes == {0: 0, 1: 0}
    main = stores[0]
    assert main.stats().refused + main.stats().evicted > 0, "the attack never reached main"
    assert sorted(k.decode() for k in main.table._data) == sorted(
        f"nodekit/{k}" for k in ("claim/0", "claim/1", "facts/0", "facts/1", "seen/1", "verdict")
    )


def test_a_process_without_the_secret_cannot_write_the_watchdogs_keys() -> None:
    main = open_store(cfg(0, 2, 5.0, NODEKIT_PREFLIGHT_PORT=str(free_port()), NODEKIT_JOB_SECRET=S1), 5)
    intruder = cfg(1, 2, 5.0, MASTER_ADDR="127.0.0.1", NODEKIT_PREFLIGHT_PORT=str(main.port), NODEKIT_JOB_SECRET=S2)
    try:
        with pytest.raises(SecretMismatch):
            open_store(intruder, 5, connect_s=2)
        held: list[socket.socket] = []
        for behaviour in BEHAVIOURS * 10:
            hostile(main.port, behaviour, held)
        assert not main.check(["nodekit/done/1"]) and main.add("nodekit/hb/1", 0) == 0
    finally:
        main.close()


def _creator(barrier: Any, jobs: Any, results: Any) -> None:
    """A separate process: for each directory it is handed, wait for every other creator, then ask for the secret."""
    while (project := jobs.get()) is not None:
        barrier.wait()
        try:
            results.put(secret.load_or_create(Path(project)))
        except Exception as e:  # reported to the test, which fails naming it
            results.put(f"{type(e).__name__}: {e}")


def _race(projects: list[Path], creators: int = 4) -> list[list[str]]:
    """Every project's secret asked for by ``creators`` processes released at the same instant."""
    ctx = multiprocessing.get_context("fork")
    barrier, jobs, results = ctx.Barrier(creators), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_creator, args=(barrier, jobs, results)) for _ in range(creators)]
    for p in procs:
        p.start()
    seen = []
    try:
        for project in projects:
            for _ in range(creators):
                jobs.put(str(project))
            seen.append([results.get(timeout=30) for _ in range(creators)])
    finally:
        for _ in procs:
            jobs.put(None)
        for p in procs:
            p.join(timeout=30)
    return seen


def test_concurrent_creators_agree_and_never_read_an_empty_file(tmp_path: Path) -> None:
    """Two `nodekit up` at once never read a half-made secret file (an unguarded create does, about 14 times in 300).
    300 races of 4 processes."""
    projects = [tmp_path / f"p{i}" for i in range(300)]
    for i, values in enumerate(_race(projects)):
        assert len(set(values)) == 1, f"race {i}: creators disagree or failed: {values}"
        assert re.fullmatch(r"[0-9a-f]{32}", values[0]), f"race {i}: {values[0]!r}"
        assert (projects[i] / ".nodekit" / "job-secret").read_text() == values[0] + "\n"
        assert sorted(p.name for p in (projects[i] / ".nodekit").iterdir()) == ["job-secret"]


@pytest.mark.parametrize("remnant", ["", "\n", "  \n"])
def test_an_empty_file_left_by_a_crash_is_replaced_and_concurrent_repairs_agree(tmp_path: Path, remnant: str) -> None:
    projects = [tmp_path / f"p{i}" for i in range(50)]
    for project in projects:
        (project / ".nodekit").mkdir(parents=True)
        (project / ".nodekit" / "job-secret").write_text(remnant)
    for i, values in enumerate(_race(projects)):
        assert len(set(values)) == 1 and re.fullmatch(r"[0-9a-f]{32}", values[0]), f"repair {i}: {values}"
        assert (projects[i] / ".nodekit" / "job-secret").read_text().strip() == values[0]
        assert stat.S_IMODE((projects[i] / ".nodekit" / "job-secret").stat().st_mode) == 0o600


def test_an_unusable_secret_someone_wrote_is_kept_and_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / ".nodekit" / "job-secret"
    path.parent.mkdir()
    path.write_text("too short\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="not a usable job secret") as e:
        secret.load_or_create(tmp_path)
    assert f"remove {path}" in e.value.one_line() and path.read_text() == "too short\n"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="cannot read the job secret"):
        secret.load_or_create(tmp_path)


def test_a_dry_run_repairs_nothing(tmp_path: Path) -> None:
    path = tmp_path / ".nodekit" / "job-secret"
    path.parent.mkdir()
    path.write_text("")
    assert len(secret.for_node({}, tmp_path, create=False)) == 32
    assert path.read_text() == ""


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secret_others_can_read_is_refused_as_known_with_the_fix(tmp_path: Path, mode: int) -> None:
    """A repository that ships .nodekit/job-secret gives every clone one public value (a checkout is 0644)."""
    path = tmp_path / ".nodekit" / "job-secret"
    path.parent.mkdir()
    path.write_text("0123456789abcdef0123456789abcdef\n")
    path.chmod(mode)
    with pytest.raises(ConfigError, match="readable by others") as e:
        secret.load_or_create(tmp_path)
    assert f"chmod 600 {path}" in e.value.one_line()
    path.chmod(0o600)
    assert secret.load_or_create(tmp_path) == "0123456789abcdef0123456789abcdef"
