"""The prose gives exit codes that exist, with their meaning (issue 47): every ``exit N``, ``exits N`` or ``exit code
N`` that a doc page, the README or a docstring or comment in nodekit/ writes, for N in nodekit's own range (10 to
99), is a code of nodekit/launcher/contract.py; and where the clause that leads to it names one code's meaning (a
stall, a GPU, a link or pair, a mismatch, a node that never arrived, peer_timeout), it is that meaning's
code.
``EXIT_*`` names the prose writes are the contract's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodekit.launcher import contract

ROOT = Path(__file__).resolve().parents[3]
CODES = {value: name for name, value in vars(contract).items() if name.startswith("EXIT_")}
# A few words that mean one code and no other, as the docs write them.
MEANS = {
    "EXIT_STACK_MISMATCH": ("mismatch", "differ"),
    "EXIT_RENDEZVOUS": ("never arriv", "rdzv_timeout"),
    "EXIT_PEER_LOST": ("peer_timeout",),
    "EXIT_LINK": ("link", "pair", "gbit"),
    "EXIT_GPU": ("gpu",),
    "EXIT_STALLED": ("stall", "no rank progress"),
}
MENTION = re.compile(r"\bexit(?:s|ed with)?(?: with)?(?: codes?)? (\d+)\b", re.IGNORECASE)
NAME = re.compile(r"(?<![\w.])EXIT_[A-Z_]+\b")  # not Env.EXIT_GUARD, a variable
CLAUSE_ENDS = (". ", "|", "\n\n", ";", ":", ",")


def _prose() -> list[Path]:
    return sorted(
        [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("compose/*.md"), *ROOT.glob("nodekit/**/*.py")]
    )


def wrong_codes(text: str) -> list[str]:
    """Each code ``text`` gives that is not the contract's, or not the one its clause's meaning has."""
    found = []
    for m in MENTION.finditer(text):
        n, line = int(m.group(1)), text.count("\n", 0, m.start()) + 1
        if not 10 <= n <= 99:
            continue  # 0, 1, 2 are every program's; 126 and up the shell's and the signals'
        if n not in CODES:
            found.append(f"line {line}: exit {n} is no code of launcher/contract.py")
            continue
        clause = text[max(text.rfind(c, 0, m.start()) for c in CLAUSE_ENDS) + 1 : m.start()].lower()
        meant = {name for name, words in MEANS.items() if any(w in clause for w in words)}
        if len(meant) == 1 and CODES[n] not in meant:
            (name,) = meant
            found.append(f"line {line}: {clause.strip()!r} means {name} = {getattr(contract, name)}, not exit {n}")
    return found


@pytest.mark.parametrize("path", _prose(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_prose_gives_exit_codes_that_exist_with_their_meaning(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert wrong_codes(text) == []
    known = {*vars(contract), *vars(contract.Env), "EXIT_BARRIER_LOGGER"}  # that one is runlog.py's logger name
    unknown = {n for n in NAME.findall(text) if n not in known}
    assert unknown == set(), f"names no constant of launcher/contract.py: {sorted(unknown)}"


def test_the_check_finds_a_wrong_code_and_a_code_that_does_not_exist() -> None:
    assert wrong_codes("no rank progressing for the timeout stops the job (exit 19).") != []
    assert wrong_codes("the watchdog names it (exit 23).") != []
    assert wrong_codes("a stall stops every node (exit 22); a lost node is named within peer_timeout (exit 19).") == []
    assert wrong_codes("the script exits 1, the shell's 127.") == []
    assert wrong_codes("with stall_action = stop every node stops its job and exits 20") != []
