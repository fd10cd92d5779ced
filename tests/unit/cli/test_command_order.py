"""`nodekit --help` lists commands by topic module, each module's in the order it defines them (issue 29): the order
is derived from where commands are registered, so it cannot drift the way COMMAND_ORDER did (k8s and layers were
missing from it)."""

from __future__ import annotations

import typer.main

from nodekit.cli.app import app
from nodekit.cli.common import TOPICS, command_order


def test_every_command_module_is_a_topic_and_every_command_is_listed() -> None:
    group = typer.main.get_group(app)
    modules = {c.callback.__module__.rpartition(".")[2] for c in group.commands.values() if c.callback}
    assert modules == set(TOPICS)
    assert sorted(command_order(group.commands)) == sorted(group.commands)


def test_help_lists_topics_in_order_and_each_modules_commands_as_defined() -> None:
    order = command_order(typer.main.get_group(app).commands)
    assert order[:5] == ["init", "lock", "base", "build", "inspect"]
    assert order.index("push") < order.index("doctor") < order.index("up") < order.index("run") < order.index("k8s")
    assert order.index("compose") + 1 == order.index("up")  # nodes.py defines up right after compose
