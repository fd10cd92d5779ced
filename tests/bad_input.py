"""The bad-input harness: hypothesis strategies for nodekit.toml, NODEKIT_* variables and flags, and the contract a
command must keep whatever they say: success, or exactly one line plus exit 2 (``assert_contract``); for input
known to be bad, exit 2 with one line naming the setting and its fix (``assert_refused``). Neither leaves a traceback
or a file half-written. Each command runs in-process (typer's CliRunner) in a fresh project under the temporary
directory; MADE lists those projects, and the ``bad_input_projects`` fixture (tests/conftest.py) removes them when a
module is done.

Used by tests/unit/cli/test_bad_input_property.py and test_bad_input_known.py, and for the commands that ask the
engine by tests/integration/test_bad_input.py.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nodekit.cli.app import app

RUNNER = CliRunner()
EXAMPLE_LOCK = Path(__file__).resolve().parents[1] / "examples" / "ddp" / "nodekit.lock"

# Values a user could plausibly write, right and wrong: types, ranges, odd strings.
ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
SCALAR = st.one_of(
    st.integers(-3, 70000), ANY_TEXT, st.booleans(), st.sampled_from(["auto", "host", "bridge", "env", "on", "0"])
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(st.sampled_from(["demo", "Demo!", "", "a.b-c"]), ANY_TEXT),
    "script": st.sampled_from(["train.py", "missing.py", "/abs/train.py", "../up.py", ""]),
    "module": st.sampled_from(["pkg.train", "", "x"]),
    "args": st.lists(ANY_TEXT, max_size=3),
    "launcher": st.sampled_from(["torchrun", "env", "mpirun", "deepspeed"]),
    "nnodes": st.one_of(st.integers(-1, 5), SCALAR),
    "nproc_per_node": st.one_of(st.sampled_from(["auto", "two"]), st.integers(-1, 4)),
    "master_port": st.one_of(st.sampled_from([0, 1, 29500, 65534, 65535, 65536]), SCALAR),
    "rdzv_timeout": st.one_of(st.integers(-1, 400), SCALAR, st.sampled_from([604800, 604801, 10**14, 1e14, 1e300])),
    "peer_timeout": st.one_of(st.integers(-1, 20), SCALAR),
    "network": st.sampled_from(["host", "bridge", "overlay"]),
    "ib": st.sampled_from(["auto", "on", "off", "maybe"]),
    "env": st.dictionaries(
        st.sampled_from(["NCCL_DEBUG", "MASTER_ADDR", "NODEKIT_X", "WORLD_SIZE", "OMP_NUM_THREADS", "RANK"]),
        st.one_of(ANY_TEXT, st.integers(0, 9)),
        max_size=3,
    ),
    "output_dir": st.sampled_from(["outputs", "/tmp/nodekit-prop-out", ""]),
    "bogus_key": SCALAR,
    # Shapes that once had holes, drawn loosely here (any outcome but 0 or one line + 2 fails); the known-bad ones
    # are drawn strictly by tests/unit/cli/test_bad_input_known.py.
    "nodes": st.dictionaries(
        st.sampled_from(["0", "1", "7"]),
        st.fixed_dictionaries(
            {},
            optional={
                "nproc_per_node": st.one_of(st.integers(-1, 3), st.just("auto"), ANY_TEXT),
                "addr": st.one_of(st.sampled_from(["10.0.0.6", "127.0.0.1", "::1"]), ANY_TEXT),
                "iface": st.one_of(st.sampled_from(["eth0", "lo", "a/b", "x" * 16]), ANY_TEXT),
                "gpus": st.integers(-1, 2000),
            },
        ),
        max_size=2,
    ),
    "mounts": st.lists(
        st.fixed_dictionaries(
            {"host": st.sampled_from(["/tmp", "/nope", "rel", "/tmp/../tmp"]), "container": ANY_TEXT.map("/".__add__)},
            optional={"check": st.sampled_from(["none", "sizes", "hashes", "all"]), "writable": st.booleans()},
        ),
        max_size=2,
    ),
    "pass_env": st.lists(st.sampled_from(["HF_TOKEN", "A B", "", "NODE_RANK", "NCCL_DEBUG"]), max_size=2),
    "compose_dir": st.sampled_from(["compose", "train.py/x", "nodekit.toml", "c\u0000d"]),
    "main": st.one_of(st.sampled_from(["10.0.0.5", "a b", "", "main.local"]), ANY_TEXT),
    # The kinds issue 28 found (tests/unit/cli/test_bad_input_known.py draws each strictly).
    "base_image": st.one_of(st.sampled_from(["nodekit/base:bookworm", "no such/IMAGE::x", "x::y"]), ANY_TEXT),
    "hosts": st.lists(
        st.one_of(st.sampled_from(["ssh://u@[::1", "ssh://@host", "ssh://u@h", "tcp://h:2375"]), ANY_TEXT), max_size=3
    ),
    "k8s": st.fixed_dictionaries({}, optional={"image": st.sampled_from(["r/x:1", "r/x:1 --privileged", "A B", ""])}),
    "slurm": st.fixed_dictionaries(
        {}, optional={"docker_host": st.sampled_from(["not a url", "unix:///run/docker.sock", "ssh://@h", ""])}
    ),
}
# Arrays nested deeper than a parser's recursion (a RecursionError traceback before issue 28).
DEEP = st.integers(1, 6_000).map(lambda n: 'script = "train.py"\nx = ' + "[" * n + "]" * n + "\n")
TOML = st.one_of(
    st.fixed_dictionaries({}, optional=FIELDS),
    st.text(max_size=40),  # anything at all, including broken TOML
    DEEP,
)
# What a shell can hold: no NUL.
ENV_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12
)
NODEKIT_ENV = st.dictionaries(
    st.sampled_from(
        [
            "NODEKIT_NNODES",
            "NODEKIT_MASTER_PORT",
            "NODEKIT_RDZV_TIMEOUT",
            "NODEKIT_NAME",
            "NODEKIT_ENV",
            "NODEKIT_ARGS",
            "NODEKIT_NPROC_PER_NODE",
            "NODEKIT_CONFIG",
            "NODEKIT_NETWORK",
        ]
    ),
    st.one_of(
        st.sampled_from(["2", "65535", "-1", "[]", '{"RANK": "1"}', "nowhere.toml", "{", "[" * 5000 + "]" * 5000]),
        ENV_TEXT,
    ),
    max_size=3,
)


def _toml_string(v: str) -> str:
    """A TOML basic string holding exactly ``v`` (control characters and DEL escaped, as TOML requires)."""
    out = []
    for c in v:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_string(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return _toml_string(str(v))


def _toml(doc: dict[str, Any] | str | bytes) -> str | bytes:
    if isinstance(doc, str | bytes):
        return doc
    return "".join(f"{k} = {_toml_value(v)}\n" for k, v in doc.items())


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


MADE: list[Path] = []


Setup = Callable[[Path], None]


def _run(argv: list[str], doc: dict[str, Any] | str | bytes, env: dict[str, str], setup: Setup | None) -> Any:
    """One command in a fresh project: (project, files before, result, a description for failures)."""
    project = Path(tempfile.mkdtemp(prefix="nodekit-prop-"))
    MADE.append(project)
    text = _toml(doc)
    (project / "nodekit.toml").write_bytes(text if isinstance(text, bytes) else text.encode())
    (project / "train.py").write_text("print('hi')\n")
    (project / "nodekit.lock").write_bytes(EXAMPLE_LOCK.read_bytes())
    if setup is not None:
        setup(project)
    before = _snapshot(project)
    clean = {k: None for k in os.environ if k.startswith("NODEKIT_")}
    cwd = os.getcwd()
    os.chdir(project)
    try:
        result = RUNNER.invoke(app, [*argv, "--config", str(project / "nodekit.toml")], env=clean | env)
    finally:
        os.chdir(cwd)
    shown = f"argv={argv} env={env} toml={text!r}\nstdout={result.stdout[-2000:]}\nstderr={result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr, shown
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}\n{shown}")
    return project, before, result, shown


def assert_contract(
    argv: list[str],
    doc: dict[str, Any] | str | bytes,
    env: dict[str, str],
    *,
    allow_1: bool = False,
    setup: Setup | None = None,
) -> Path:
    """Run one command in a fresh project and assert the contract; return the project for further checks."""
    project, before, result, shown = _run(argv, doc, env, setup)
    assert result.exit_code in ((0, 1, 2) if allow_1 else (0, 2)), shown
    if result.exit_code == 2:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("nodekit: error:"), shown
        assert _snapshot(project) == before, f"a refused command changed files\n{shown}"
    return project


def assert_refused(argv: list[str], doc: dict[str, Any] | str | bytes, key: str, setup: Setup | None = None) -> None:
    """The stricter contract for input known to be bad: exit 2, one line naming ``key`` with a fix, no file
    changed (no compose file, no secret), nothing started."""
    project, before, result, shown = _run(argv, doc, {}, setup)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2, f"accepted (exit {result.exit_code}), should be refused naming {key}\n{shown}"
    assert len(lines) == 1 and lines[0].startswith("nodekit: error:") and "Fix:" in lines[0], shown
    assert key in lines[0], f"the line does not name {key}\n{shown}"
    assert _snapshot(project) == before, f"a refused command changed files\n{shown}"


def report_count(name: str, seen: list[int], record_property: Callable[[str, object], None]) -> None:
    record_property(f"{name}_examples", len(seen))
    print(f"{name}: {len(seen)} inputs tried")


BOUNDED = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
