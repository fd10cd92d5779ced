"""``#SBATCH`` lines as sbatch reads them (issue 28): sbatch splits each line without a shell, at whitespace and an
unquoted ``#`` (src/sbatch/opt.c, ``_get_argument``), so every value is quoted for that reader or refused with one
line, and ``sbatch_args`` may not override the options nodekit's plan depends on. The reader below follows sbatch's
parser; tests/cluster/test_slurm.py submits a project under a path with a space and a ``#`` to the real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodekit.backends.slurm.job import InspectedImage, plan_job, sbatch_value
from nodekit.backends.slurm.render import render
from nodekit.config.backends import SlurmSettings
from nodekit.config.settings import Settings
from nodekit.errors import UsageError

IMAGE = InspectedImage(ref="nodekit/demo:1", id="sha256:" + "ab" * 32, entrypoint=("python", "-m", "nodekit.launcher"))


def sbatch_words(line: str) -> list[str]:
    """The arguments sbatch takes from one ``#SBATCH`` line (its _get_argument, applied until the line ends)."""
    words: list[str] = []
    i = 0
    while True:
        while i < len(line) and line[i].isspace():
            i += 1
        if i >= len(line):
            return words
        word: list[str] = []
        quote, escape = "", False
        while i < len(line) and (quote or not line[i].isspace()):
            c = line[i]
            i += 1
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "\"'":
                quote = c
                continue
            elif c == "#":
                return [*words, "".join(word)] if word else words
            word.append(c)
        assert not quote, f"unmatched quote in {line!r}"
        words.append("".join(word))


def options(text: str) -> list[str]:
    return [w for ln in text.splitlines() if ln.startswith("#SBATCH ") for w in sbatch_words(ln[len("#SBATCH ") :])]


def job_text(d: Path, *, unchecked: bool = False, **slurm: Any) -> str:
    """The script for ``[slurm]`` = ``slurm``; ``unchecked`` skips the settings' own validation, to show what the
    plan refuses by itself."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.py").write_text("")
    table = SlurmSettings.model_construct(**slurm) if unchecked else SlurmSettings(**slurm)
    s = Settings(project_dir=d, name="demo", script="train.py", nnodes=2, slurm=table)
    return render(plan_job(s, IMAGE, mode="docker", job_secret="s" * 32, report_token="t" * 32))


@pytest.mark.parametrize(
    "value", ["plain", "two words", "my proj#2", "it's", 'say "hi"', "back\\slash", "tab\there", "", "ünï", "50%"]
)
def test_a_quoted_value_is_read_back_whole(value: str) -> None:
    assert sbatch_words(f"--comment={sbatch_value(value)}") == [f"--comment={value}"]


def test_a_project_under_a_space_and_a_hash_keeps_its_log_path_and_one_option_per_value(tmp_path: Path) -> None:
    project = tmp_path / "my proj#2" / "100%"
    text = job_text(project, partition="gpu --chdir=/etc", sbatch_args=("--comment=a b # c", "--exclusive"))
    got = options(text)
    # Slurm's own pattern character: "%%" in the log's file name is one "%".
    assert f"--output={project}/outputs/slurm-%j.out".replace("100%", "100%%") in got
    assert "--partition=gpu --chdir=/etc" in got and not any(o.startswith("--chdir") for o in got)
    assert "--comment=a b # c" in got and "--exclusive" in got
    assert got[:3] == ["--job-name=demo", "--nodes=2", "--ntasks-per-node=1"]


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("--nodes=1", "--nodes"),
        ("-N1", "--nodes"),
        ("--ntasks-per-node=2", "--ntasks-per-node"),
        ("--ntasks-per-n=2", "--ntasks-per-node"),
        ("--output=/tmp/x", "--output"),
        ("--ou=/tmp/x", "--output"),
        ("-o/tmp/x", "--output"),
        ("-p gpu", "not one sbatch option"),
        ("qos=high", "not one sbatch option"),
        ("--comment=my hetjob", "hetjob"),
        # Review 2026-12 N7: a name that sbatch reads as two words, or unquotes, passed the check on --nodes.
        ("--exclusive --nodes=1", "not one sbatch option"),
        ("--exclusive --output=/tmp/x", "not one sbatch option"),
        ("--exclusive --ntasks-per-node=4", "not one sbatch option"),
        ('--"nodes"=1', "not one sbatch option"),
        ("--no\\des=1", "not one sbatch option"),
        ("--exclusive#--nodes=1", "not one sbatch option"),
    ],
)
def test_sbatch_args_that_would_change_the_planned_job_are_refused_in_one_line(
    tmp_path: Path, item: str, needle: str
) -> None:
    """Refused by the plan itself, settings validated or not (the settings refuse a name that is not one word
    already: tests/unit/cli/test_bad_input_known.py, through the CLI)."""
    with pytest.raises(UsageError, match=needle) as e:
        job_text(tmp_path / "p", unchecked=True, sbatch_args=(item,))
    assert "\n" not in e.value.one_line()


@pytest.mark.parametrize(
    "item", ["--comment=a b # c", '--comment=say "hi"', "--exclusive", "-pgpu", "--qos=a --nodes=1", "-t1:00:00"]
)
def test_every_accepted_item_is_exactly_one_word_of_sbatch(tmp_path: Path, item: str) -> None:
    """What is written for an accepted item is the one option it says: sbatch reads it back as the item itself."""
    got = options(job_text(tmp_path / "p", sbatch_args=(item,)))
    assert (
        got[-1] == item
        and got.count("--nodes=2") == 1
        and got[:3] == ["--job-name=demo", "--nodes=2", "--ntasks-per-node=1"]
    )


def test_options_that_only_share_a_prefix_are_accepted(tmp_path: Path) -> None:
    got = options(job_text(tmp_path / "p", sbatch_args=("--ntasks=2", "--nodelist=n[1-2]", "--open-mode=append")))
    assert {"--ntasks=2", "--nodelist=n[1-2]", "--open-mode=append"} <= set(got)


def test_a_backslash_in_the_log_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="backslash"):
        job_text(tmp_path / "back\\slash")
