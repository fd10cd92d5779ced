"""A cloned repository's symbolic links where nodekit writes a file it generates (review 2026-12, N3): the real CLI
refuses in one line, exit 2, naming the link and its fix, and the file the link points to is left as it was.

The attack: the repository commits ``compose/node-0.yaml -> ~/.ssh/authorized_keys`` (or ``compose -> ~/.ssh``)
and chooses part of the rendered text through its nodekit.toml (an env value holding a key line); a command that
only renders a file then replaced authorized_keys with the compose YAML, key line included."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.bad_input import MADE, _run

pytestmark = pytest.mark.usefixtures("bad_input_projects")

KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAttackerAttackerAttackerAttackerAttackerAtt x"
DOC = {"name": "hostile", "script": "train.py", "nnodes": 2, "nproc_per_node": 1, "env": {"NOTE": f"see\n{KEY_LINE}"}}
COMPOSE = ["compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y"]
USERS = "the user's own key line\n"


def _home() -> Path:
    """A directory outside the project standing for ~/.ssh, with an authorized_keys of the user's."""
    home = Path(tempfile.mkdtemp(prefix="nodekit-prop-home-"))
    MADE.append(home)
    (home / "authorized_keys").write_text(USERS)
    (home / "authorized_keys").chmod(0o600)
    return home


def _refused(result: object, shown: str, link: str) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]  # type: ignore[attr-defined]
    assert result.exit_code == 2, shown  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("nodekit: error:") and "Fix:" in lines[0], shown
    assert f"{link} is a symbolic link" in lines[0] and f"rm {link}" in lines[0], shown
    return lines[0]


def test_compose_refuses_a_node_file_that_is_a_link_out_of_the_project() -> None:
    home = _home()
    made: list[Path] = []

    def plant(project: Path) -> None:
        (project / "compose").mkdir()
        (project / "compose" / "node-0.yaml").symlink_to(home / "authorized_keys")
        made.append(project)

    _, _, result, shown = _run(COMPOSE, DOC, {}, plant)
    _refused(result, shown, str(made[0] / "compose" / "node-0.yaml"))
    assert (home / "authorized_keys").read_text() == USERS
    assert (made[0] / "compose" / "node-0.yaml").is_symlink()
    assert sorted(p.name for p in home.iterdir()) == ["authorized_keys"]


def test_compose_refuses_a_compose_directory_that_is_a_link_out_of_the_project() -> None:
    home = _home()
    (home / "node-0.yaml").write_text(USERS)  # a file of the user's with the very name nodekit writes
    made: list[Path] = []

    def plant(project: Path) -> None:
        (project / "compose").symlink_to(home, target_is_directory=True)
        made.append(project)

    _, _, result, shown = _run(COMPOSE, DOC, {}, plant)
    _refused(result, shown, str(made[0] / "compose"))
    assert (home / "node-0.yaml").read_text() == USERS and (home / "authorized_keys").read_text() == USERS
    assert sorted(p.name for p in home.iterdir()) == ["authorized_keys", "node-0.yaml"]


def test_k8s_refuses_a_manifest_that_is_a_link() -> None:
    """The same writer serves every backend: the Kubernetes manifests are refused alike."""
    home = _home()
    made: list[Path] = []

    def plant(project: Path) -> None:
        (project / "k8s").mkdir()
        (project / "k8s" / "job.yaml").symlink_to(home / "authorized_keys")
        made.append(project)

    _, _, result, shown = _run(["k8s", "--image", "reg.example.com/x:1"], DOC, {}, plant)
    _refused(result, shown, str(made[0] / "k8s" / "job.yaml"))
    assert (home / "authorized_keys").read_text() == USERS


@pytest.mark.parametrize(
    "where", [".nodekit", ".nodekit/runs", ".nodekit/build", ".nodekit/build/wheels", ".nodekit/wheelhouse/x.whl"]
)
def test_a_link_in_nodekits_own_state_is_refused_before_anything_is_written(where: str) -> None:
    """.nodekit is nodekit's own (the job secret, run records, the build's staging, whose wheel directories are
    emptied of what they should not hold): a clone that ships a link there would have nodekit write, or delete,
    in the directory it points to. Refused when the configuration is read, before any command writes."""
    home = _home()
    made: list[Path] = []

    def plant(project: Path) -> None:
        link = project / where
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(home, target_is_directory=True)
        made.append(link)

    _, _, result, shown = _run(COMPOSE, DOC, {}, plant)
    _refused(result, shown, str(made[0]))
    assert sorted(p.name for p in home.iterdir()) == ["authorized_keys"]
