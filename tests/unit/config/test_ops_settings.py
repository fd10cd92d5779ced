"""The settings of run records and notifications: defaults, the [notify] table's checks, and that the webhook's URL
has no setting of its own (it is named, by variable or file, never written in nodekit.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.config import settings as config
from nodekit.errors import ConfigError


def load(tmp_path: Path, text: str) -> config.Settings:
    (tmp_path / "nodekit.toml").write_text(text)
    return config.load(tmp_path / "nodekit.toml")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NODEKIT_CONFIG", "NODEKIT_RUNS_KEEP", "NODEKIT_KEEP_CONTAINERS", "NODEKIT_NOTIFY"):
        monkeypatch.delenv(var, raising=False)


def test_defaults(tmp_path: Path) -> None:
    s = load(tmp_path, "")
    assert (s.runs_keep, s.keep_containers, s.notify.configured) == (50, False, False)
    assert s.notify.on == ("start", "failure", "finish") and s.notify.format == "slack"


def test_a_notify_table_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEKIT_RUNS_KEEP", "7")
    s = load(tmp_path, '[notify]\nurl_env = "SLACK_WEBHOOK_URL"\nformat = "json"\non = ["failure"]\n')
    assert s.runs_keep == 7 and s.notify.url_env == "SLACK_WEBHOOK_URL" and s.notify.on == ("failure",)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[notify]\nurl_env = "https://hooks.slack.com/services/T/B/x"\n', "holds a URL, not the name"),
        ('[notify]\nurl = "https://hooks.slack.com/services/T/B/x"\n', "url"),
        ('[notify]\non = ["start", "always"]\n', "on"),
        ("[notify]\ndeadline_s = 0\n", "deadline_s"),
        ("runs_keep = 0\n", "runs_keep"),
    ],
)
def test_bad_notify_settings_are_refused_naming_them(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text)
    assert needle in e.value.one_line() and "https://hooks" not in e.value.one_line()
