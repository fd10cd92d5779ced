"""Property: whatever nodekit.toml, NODEKIT_* variables and flags say, ``compose``, ``up --dry-run``,
``build --dry-run`` and ``doctor`` end in success or in exactly one line plus exit 2: never a traceback, never a
file half-written.

The CLI runs in-process (typer's CliRunner). ``compose`` and ``up --dry-run`` with ``--image`` never ask the
engine, so they run here; ``build --dry-run`` and ``doctor`` do, and run in tests/integration/test_bad_input.py
with the same harness (tests/bad_input.py). Examples are derandomized and bounded (about 30 s here); each test
prints how many inputs it tried (docs/reliability.md quotes them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bad_input import BOUNDED, NODEKIT_ENV, TOML, assert_contract, report_count

pytestmark = pytest.mark.usefixtures("bad_input_projects")

# No unresolvable names: a DNS lookup can take seconds here (test_errors.py beside this file covers that refusal).
MAINS = st.sampled_from(["127.0.0.1", "10.0.0.5", "::1", "300.1.2.3", "198.51.100.7", "localhost"])
NODE_FLAGS = st.fixed_dictionaries(
    # --image always: without it the image is looked up in the engine (build and doctor cover the engine here).
    {
        "--node-rank": st.integers(-2, 4),
        "--main": MAINS,
        "--image": st.sampled_from(["nodekit/prop:0123456789ab", "x:y", "Bad Image", "no such/IMAGE::x", "x::y"]),
    },
    optional={
        "--nnodes": st.integers(-1, 4),
        "--master-port": st.sampled_from([0, 1, 29500, 65534, 65535, 70000]),
        "--nproc-per-node": st.sampled_from(["auto", "1", "x", "-3"]),
        "--script": st.sampled_from(["train.py", "missing.py"]),
    },
)


def test_compose_never_tracebacks_or_half_writes(record_property: Callable[[str, object], None]) -> None:
    seen: list[int] = []

    @settings(BOUNDED, max_examples=150)
    @given(doc=TOML, env=NODEKIT_ENV, flags=NODE_FLAGS)
    def check(doc: dict[str, Any] | str, env: dict[str, str], flags: dict[str, Any]) -> None:
        seen.append(1)
        argv = ["compose", *(x for k, v in flags.items() for x in (k, str(v)))]
        project = assert_contract(argv, doc, env)
        for f in (project / "compose").glob("*") if (project / "compose").is_dir() else []:
            assert isinstance(yaml.safe_load(f.read_text()), dict), f"{f} is not a complete compose file"

    check()
    report_count("compose", seen, record_property)


def test_up_dry_run_never_tracebacks_or_writes(record_property: Callable[[str, object], None]) -> None:
    seen: list[int] = []

    @settings(BOUNDED, max_examples=100)
    @given(doc=TOML, env=NODEKIT_ENV, flags=NODE_FLAGS)
    def check(doc: dict[str, Any] | str, env: dict[str, str], flags: dict[str, Any]) -> None:
        seen.append(1)
        argv = ["up", "--dry-run", *(x for k, v in flags.items() for x in (k, str(v)))]
        project = assert_contract(argv, doc, env)
        assert not (project / "compose").exists(), "--dry-run wrote a compose file"

    check()
    report_count("up_dry_run", seen, record_property)
