"""Property: whatever nodekit.toml, NODEKIT_* variables and flags say, ``compose``, ``up --dry-run``,
``build --dry-run`` and ``doctor`` end in success or in exactly one line plus exit 2: never a traceback, never a
file half-written.

The CLI runs in-process (typer's CliRunner). ``compose`` and ``up --dry-run`` with ``--image`` never ask the
engine, so they run here; ``build --dry-run`` and ``doctor`` do, and run in tests/integration/test_bad_input.py
with the helpers below. Examples are derandomized and bounded (about 30 s here); each test prints how many inputs
it tried (docs/reliability.md quotes them).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nodekit.cli.app import app

RUNNER = CliRunner()
EXAMPLE_LOCK = Path(__file__).resolve().parents[2] / "examples" / "ddp" / "nodekit.lock"

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
    "launcher": st.sampled_from(["torchrun", "env", "mpirun"]),
    "nnodes": st.one_of(st.integers(-1, 5), SCALAR),
    "nproc_per_node": st.one_of(st.sampled_from(["auto", "two"]), st.integers(-1, 4)),
    "master_port": st.one_of(st.sampled_from([0, 1, 29500, 65534, 65535, 65536]), SCALAR),
    "rdzv_timeout": st.one_of(st.integers(-1, 400), SCALAR),
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
}
TOML = st.one_of(
    st.fixed_dictionaries({}, optional=FIELDS),
    st.text(max_size=40),  # anything at all, including broken TOML
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
    st.one_of(st.sampled_from(["2", "65535", "-1", "[]", '{"RANK": "1"}', "nowhere.toml", "{"]), ENV_TEXT),
    max_size=3,
)
# No unresolvable names: a DNS lookup can take seconds here (test_cli_errors.py covers that refusal).
MAINS = st.sampled_from(["127.0.0.1", "10.0.0.5", "::1", "300.1.2.3", "198.51.100.7", "localhost"])
NODE_FLAGS = st.fixed_dictionaries(
    # --image always: without it the image is looked up in the engine (build and doctor cover the engine here).
    {
        "--node-rank": st.integers(-2, 4),
        "--main": MAINS,
        "--image": st.sampled_from(["nodekit/prop:0123456789ab", "x:y", "Bad Image"]),
    },
    optional={
        "--nnodes": st.integers(-1, 4),
        "--master-port": st.sampled_from([0, 1, 29500, 65534, 65535, 70000]),
        "--nproc-per-node": st.sampled_from(["auto", "1", "x", "-3"]),
        "--script": st.sampled_from(["train.py", "missing.py"]),
    },
)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)  # a JSON string is a TOML basic string for the characters used here


def _toml(doc: dict[str, Any] | str) -> str:
    if isinstance(doc, str):
        return doc
    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append(f"[{k}]\n" + "".join(f"{kk} = {_toml_value(vv)}\n" for kk, vv in v.items()))
        else:
            lines.append(f"{k} = {_toml_value(v)}\n")
    return "".join(lines) + "".join(tables)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _check(argv: list[str], doc: dict[str, Any] | str, env: dict[str, str], *, allow_1: bool = False) -> Path:
    """Run one command in a fresh project and assert the contract; return the project for further checks."""
    project = Path(tempfile.mkdtemp(prefix="nodekit-prop-"))
    (project / "nodekit.toml").write_text(_toml(doc))
    (project / "train.py").write_text("print('hi')\n")
    (project / "nodekit.lock").write_bytes(EXAMPLE_LOCK.read_bytes())
    before = _snapshot(project)
    clean = {k: None for k in os.environ if k.startswith("NODEKIT_")}
    cwd = os.getcwd()
    os.chdir(project)
    try:
        result = RUNNER.invoke(app, [*argv, "--config", str(project / "nodekit.toml")], env=clean | env)
    finally:
        os.chdir(cwd)
    shown = f"argv={argv} env={env} toml={_toml(doc)!r}\nstdout={result.stdout[-2000:]}\nstderr={result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr, shown
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {type(result.exception).__name__}: {result.exception}\n{shown}")
    assert result.exit_code in ((0, 1, 2) if allow_1 else (0, 2)), shown
    if result.exit_code == 2:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("nodekit: error:"), shown
        assert _snapshot(project) == before, f"a refused command changed files\n{shown}"
    return project


def _count(name: str, seen: list[int], record_property: Callable[[str, object], None]) -> None:
    record_property(f"{name}_examples", len(seen))
    print(f"{name}: {len(seen)} inputs tried")


BOUNDED = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)


def test_compose_never_tracebacks_or_half_writes(record_property: Callable[[str, object], None]) -> None:
    seen: list[int] = []

    @settings(BOUNDED, max_examples=150)
    @given(doc=TOML, env=NODEKIT_ENV, flags=NODE_FLAGS)
    def check(doc: dict[str, Any] | str, env: dict[str, str], flags: dict[str, Any]) -> None:
        seen.append(1)
        argv = ["compose", *(x for k, v in flags.items() for x in (k, str(v)))]
        project = _check(argv, doc, env)
        for f in (project / "compose").glob("*") if (project / "compose").is_dir() else []:
            assert isinstance(yaml.safe_load(f.read_text()), dict), f"{f} is not a complete compose file"

    check()
    _count("compose", seen, record_property)


def test_up_dry_run_never_tracebacks_or_writes(record_property: Callable[[str, object], None]) -> None:
    seen: list[int] = []

    @settings(BOUNDED, max_examples=100)
    @given(doc=TOML, env=NODEKIT_ENV, flags=NODE_FLAGS)
    def check(doc: dict[str, Any] | str, env: dict[str, str], flags: dict[str, Any]) -> None:
        seen.append(1)
        argv = ["up", "--dry-run", *(x for k, v in flags.items() for x in (k, str(v)))]
        project = _check(argv, doc, env)
        assert not (project / "compose").exists(), "--dry-run wrote a compose file"

    check()
    _count("up_dry_run", seen, record_property)
