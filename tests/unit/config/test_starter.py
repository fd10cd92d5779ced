"""``nodekit init``: packages from the project's requirements.txt and pyproject.toml, a warning on an unpinned torch,
a starter with hosts and [[mounts]] examples, and a .dockerignore that keeps data, outputs and environments out."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.config.settings import load
from nodekit.config.starter import DOCKERIGNORE, project_packages
from nodekit.image.dockerignore import ignore_rules

runner = CliRunner()


def test_init_takes_the_packages_of_requirements_txt_and_warns_on_an_unpinned_torch(project: Path) -> None:
    (project / "requirements.txt").write_text("# deps\ntorch>=2.3\nnumpy==2.1.0  # arrays\n-r more.txt\n")
    result = runner.invoke(app, ["init", "--name", "demo"])
    assert result.exit_code == 0, result.output
    assert "wrote nodekit.toml (packages from requirements.txt)" in result.stdout
    assert "torch is not pinned ('torch>=2.3')" in result.stderr and "torch==2.13.0+cpu" in result.stderr
    assert "left out '-r more.txt'" in result.stderr
    settings = load()
    assert settings.packages == ("torch>=2.3", "numpy==2.1.0")
    text = (project / "nodekit.toml").read_text()
    assert '# hosts = ["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"]' in text
    assert "# [[mounts]]" in text and '# host = "data"' in text


def test_pyproject_dependencies_join_and_a_missing_torch_is_added_pinned() -> None:
    found = project_packages(None, '[project]\nname = "x"\ndependencies = ["transformers==4.50.0", "numpy"]\n')
    assert found.packages == ("torch==2.13.0", "transformers==4.50.0", "numpy")
    assert found.found_in == ("pyproject.toml",) and found.warnings == ()
    both = project_packages("numpy==2.1.0\ntorch==2.13.0\n", '[project]\ndependencies = ["numpy", "rich"]\n')
    assert both.packages == ("numpy==2.1.0", "torch==2.13.0", "rich")  # each name once, requirements.txt first
    assert project_packages(None, None).packages == ("torch==2.13.0",)
    assert project_packages("torch==2.13.0+cpu\n", None).warnings == ()


def test_init_writes_a_dockerignore_that_keeps_data_outputs_and_environments_out(project: Path) -> None:
    result = runner.invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    assert (project / ".dockerignore").read_text() == DOCKERIGNORE
    rules = ignore_rules(DOCKERIGNORE)
    for left_out in ("data/train.csv", "outputs/result.json", ".venv/bin/python", "venv/lib/x.py", "wandb/run/x",
                     "models/best.ckpt", "sub/weights.pt", "pkg/__pycache__/m.pyc", "nodekit.toml"):  # fmt: skip
        assert rules.excluded(left_out), left_out
    for kept in ("train.py", "pkg/model.py", "configs/base.yaml", "README.md"):
        assert not rules.excluded(kept), kept


def test_init_says_how_the_job_sees_the_data_it_keeps_out_of_the_image(project: Path) -> None:
    (project / "data").mkdir()
    result = runner.invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    said = "data/ stays out of the image; the job sees it through a mount: uncomment [[mounts]] in nodekit.toml"
    assert f'{said} (host = "data", container = "/data")' in result.stdout
    text = (project / "nodekit.toml").read_text()
    uncommented = text.replace('# [[mounts]]\n# host = "data"', '[[mounts]]\nhost = "data"').replace(
        '# container = "/data"', 'container = "/data"'
    )
    (project / "nodekit.toml").write_text(uncommented)
    (mount,) = load().mounts
    assert (mount.host, mount.container) == ("data", "/data")


def test_an_existing_dockerignore_is_the_users(project: Path) -> None:
    (project / ".dockerignore").write_text("mine/\n")
    assert runner.invoke(app, ["init"]).exit_code == 0
    assert (project / ".dockerignore").read_text() == "mine/\n"
