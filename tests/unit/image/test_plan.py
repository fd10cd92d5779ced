"""The image build plan: .dockerignore semantics, fingerprint stability and sensitivity, tag, labels, Dockerfile."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from nodekit.image.builder import hash_tree, launcher_tree
from nodekit.image.plan import (
    DEFAULT_EXCLUDES,
    ENTRYPOINT,
    IMAGE_ENV,
    LABEL_BASE,
    LABEL_FINGERPRINT,
    LABEL_LOCK,
    LABEL_NAME,
    LABEL_PYTHON,
    LABEL_TORCH,
    LABEL_VERSION,
    METADATA_ARGS,
    PACKAGE_LAYERS,
    SOURCE_DATE_EPOCH,
    WORKDIR,
    IgnoreRules,
    StackInputs,
    TreeEntry,
    fingerprint,
    ignore_rules,
    input_build_args,
    parse_dockerignore,
    plan_build,
)

# --- .dockerignore -------------------------------------------------------------------------------------------


def rules(text: str) -> IgnoreRules:
    return IgnoreRules(parse_dockerignore(text))


@pytest.mark.parametrize(
    ("patterns", "path", "excluded"),
    [
        # anchored at the context root, unlike .gitignore
        ("*.md", "README.md", True),
        ("*.md", "docs/guide.md", False),
        ("**/*.md", "docs/guide.md", True),
        ("**/*.md", "README.md", True),
        # a directory excludes everything below it; trailing and leading slashes do not matter
        ("data", "data/a/b.bin", True),
        ("data/", "data/a/b.bin", True),
        ("/data", "data/a/b.bin", True),
        ("/data", "src/data", False),
        # ** spans any number of directories, also none
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("a/**/b", "a/x/y/c", False),
        ("logs/**", "logs/today.txt", True),
        ("logs/**", "logs", False),
        ("**", "anything/at/all", True),
        # * and ? stay inside one path element
        ("*/tmp", "x/tmp", True),
        ("*/tmp", "x/y/tmp", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("file[0-3].txt", "file2.txt", True),
        ("file[0-3].txt", "file7.txt", False),
        # escapes, and regex characters that are literal in Docker patterns
        (r"weird\*name", "weird*name", True),
        (r"weird\*name", "weirdXname", False),
        ("a+b.(c)", "a+b.(c)", True),
        ("a+b.(c)", "aab.(c)", False),
        # cleaned like Go's filepath.Clean
        ("./src/../tmp", "tmp/x", True),
        # exceptions: last matching pattern wins
        ("*\n!keep.txt", "keep.txt", False),
        ("*\n!keep.txt", "other.txt", True),
        ("!keep.txt\n*", "keep.txt", True),
        ("docs\n!docs/keep.md", "docs/keep.md", False),
        ("docs\n!docs/keep.md", "docs/drop.md", True),
        ("**/*.log\n!important.log", "important.log", False),
        ("**/*.log\n!important.log", "sub/important.log", True),
        # comments: only a # in the first column; surrounding whitespace is trimmed
        ("# data", "data", False),
        ("# data\n  data  ", "data", True),
        (" #data", "#data", True),
        ("\n\n", "anything", False),
    ],
)
def test_dockerignore_semantics(patterns: str, path: str, excluded: bool) -> None:
    assert rules(patterns).excluded(path) is excluded


def test_parse_dockerignore_normalizes_like_docker() -> None:
    text = "\ufeff# comment\n/build/\n! keep \n./a//b/../c\n\n  spaced  \n"
    assert parse_dockerignore(text) == ["build", "!keep", "a/c", "spaced"]


def test_invalid_pattern_is_a_config_error() -> None:
    from nodekit.errors import ConfigError

    with pytest.raises(ConfigError, match="dockerignore"):
        rules("file[0-3.txt")


def test_may_include_below_only_when_an_exception_can_reach_inside() -> None:
    r = rules("docs\n!docs/keep.md\nbig")
    assert r.may_include_below("docs")
    assert not r.may_include_below("big")
    assert rules("data\n!**/keep").may_include_below("data")


def test_default_excludes_come_first_and_user_can_override() -> None:
    r = ignore_rules("!outputs", extra_excludes=["outputs", "compose/node-*.yaml"])
    assert r.patterns[: len(DEFAULT_EXCLUDES)] == DEFAULT_EXCLUDES
    assert not r.excluded("outputs/x")
    assert r.excluded("compose/node-0.yaml")
    assert not r.excluded("compose/template.yaml")
    for path in (".git/HEAD", ".nodekit/wheelhouse/x.whl", "pkg/__pycache__/m.cpython-311.pyc", "m.pyc"):
        assert r.excluded(path), path
    assert not r.excluded("nodekit.lock")


# --- trees and the fingerprint ------------------------------------------------------------------------------


def make_project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / ".dockerignore").write_text("data\n*.log\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.symlink("train.py", root / "link.py")
    return root


def tree(root: Path) -> tuple[TreeEntry, ...]:
    text = (root / ".dockerignore").read_text() if (root / ".dockerignore").exists() else None
    return hash_tree(root, ignore_rules(text))


BASE_INPUTS = {
    "base_id": "sha256:" + "b" * 64,
    "lock_text": "torch==2.13.0+cpu --hash=sha256:" + "1" * 64 + "\n",
    "dockerfile_text": "FROM x\n",
    "build_args": tuple(sorted(input_build_args("nodekit/base:bookworm").items())),
    "launcher": (TreeEntry(path="nodekit/__init__.py", kind="file", mode=0o644, digest="d" * 64),),
}


def fp(code: tuple[TreeEntry, ...], **over: object) -> str:
    return fingerprint(StackInputs(**{**BASE_INPUTS, "code": code, **over}))  # type: ignore[arg-type]


def test_tree_follows_dockerignore_and_records_links(tmp_path: Path) -> None:
    paths = {e.path: e for e in tree(make_project(tmp_path))}
    assert set(paths) == {"train.py", "pkg", "pkg/__init__.py", "pkg/model.py", "link.py"}
    assert paths["link.py"].kind == "link"
    assert paths["pkg"].kind == "dir"
    assert paths["train.py"].mode == 0o644


def test_fingerprint_is_stable_across_mtimes_walk_order_and_umask(tmp_path: Path) -> None:
    a = tree(make_project(tmp_path / "a"))
    b_root = make_project(tmp_path / "b")
    os.utime(b_root / "train.py", (1, 1))
    os.utime(b_root / "pkg", (2, 2))
    (b_root / "pkg" / "model.py").chmod(0o600)  # another umask; still not executable
    b = tree(b_root)
    assert fp(a) == fp(b)
    assert fp(a) == fp(tuple(reversed(a)))
    assert re.fullmatch(r"[0-9a-f]{64}", fp(a))


def test_fingerprint_ignores_excluded_files(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    before = fp(tree(root))
    (root / "data" / "big.bin").write_bytes(b"changed")
    (root / "debug.log").write_text("noise")
    (root / ".git" / "HEAD").write_text("other")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    (root / ".nodekit").mkdir()
    (root / ".nodekit" / "last-build.json").write_text("{}")
    assert fp(tree(root)) == before


@pytest.mark.parametrize(
    "change",
    ["content", "new_file", "rename", "chmod_x", "link_target", "empty_dir", "dockerignore_exception"],
)
def test_fingerprint_changes_with_the_code(tmp_path: Path, change: str) -> None:
    root = make_project(tmp_path)
    before = fp(tree(root))
    if change == "content":
        (root / "pkg" / "model.py").write_text("W = 2\n")
    elif change == "new_file":
        (root / "pkg" / "extra.py").write_text("")
    elif change == "rename":
        (root / "pkg" / "model.py").rename(root / "pkg" / "model2.py")
    elif change == "chmod_x":
        (root / "train.py").chmod(0o755)
    elif change == "link_target":
        (root / "link.py").unlink()
        os.symlink("pkg/model.py", root / "link.py")
    elif change == "empty_dir":
        (root / "empty").mkdir()
    elif change == "dockerignore_exception":
        (root / ".dockerignore").write_text("data\n*.log\n!data/big.bin\n")
    assert fp(tree(root)) != before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_id", "sha256:" + "c" * 64),
        ("lock_text", "torch==2.13.0+cpu --hash=sha256:" + "2" * 64 + "\n"),
        ("dockerfile_text", "FROM y\n"),
        ("build_args", (("BASE_IMAGE", "other/base:1"),)),
        ("launcher", (TreeEntry(path="nodekit/__init__.py", kind="file", mode=0o644, digest="e" * 64),)),
        ("launcher", (TreeEntry(path="nodekit/__init__.py", kind="file", mode=0o755, digest="d" * 64),)),
    ],
)
def test_fingerprint_changes_with_every_other_input(field: str, value: object) -> None:
    code = (TreeEntry(path="train.py", kind="file", mode=0o644, digest="a" * 64),)
    assert fp(code, **{field: value}) != fp(code)


def test_size_is_not_an_input() -> None:
    a = (TreeEntry(path="t.py", kind="file", mode=0o644, digest="a" * 64, size=1),)
    b = (TreeEntry(path="t.py", kind="file", mode=0o644, digest="a" * 64, size=2),)
    assert fp(a) == fp(b)


def test_staging_copies_exactly_what_is_hashed(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    stage = tmp_path / "stage"
    stage.mkdir()
    staged = hash_tree(root, ignore_rules((root / ".dockerignore").read_text()), stage=stage)
    assert staged == tree(root)
    assert (stage / "train.py").read_text() == "print('train')\n"
    # every staged mtime is clamped, the root's and the link's too: the layer is the same on any machine
    for p in [stage, *stage.rglob("*")]:
        assert p.lstat().st_mtime == SOURCE_DATE_EPOCH, p
    assert os.readlink(stage / "link.py") == "train.py"
    assert not (stage / "data").exists()
    assert not (stage / ".git").exists()
    # the copy, walked again with no rules beyond the defaults, is the same tree
    assert hash_tree(stage, IgnoreRules([])) == staged


def test_launcher_tree_holds_init_and_launcher_only() -> None:
    entries = launcher_tree()
    paths = [e.path for e in entries]
    assert paths[:3] == ["nodekit", "nodekit/__init__.py", "nodekit/launcher"]
    assert all(p == "nodekit" or p.startswith(("nodekit/__init__.py", "nodekit/launcher")) for p in paths)
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in paths)


# --- the plan ------------------------------------------------------------------------------------------------


def test_plan_build_tag_labels_and_args(tmp_path: Path) -> None:
    code = (TreeEntry(path="train.py", kind="file", mode=0o644, digest="a" * 64, size=10),)
    plan = plan_build(
        name="demo",
        base_image="nodekit/base:bookworm",
        base_id="sha256:" + "b" * 64,
        lock_text="torch==2.13.0+cpu --hash=sha256:" + "1" * 64 + "\n",
        torch="2.13.0+cpu",
        packages=1,
        python="3.11",
        dockerfile_text="FROM x\n",
        launcher=BASE_INPUTS["launcher"],  # type: ignore[arg-type]
        code=code,
        stage_dir=tmp_path / "stage",
        version="0.1.0",
    )
    assert plan.fingerprint == fp(code)
    assert plan.tag == f"nodekit/demo:{plan.fingerprint[:12]}"
    labels = dict(plan.labels)
    assert labels[LABEL_NAME] == "demo"
    assert labels[LABEL_FINGERPRINT] == plan.fingerprint
    assert labels[LABEL_TORCH] == "2.13.0+cpu"
    assert labels[LABEL_PYTHON] == "3.11"
    assert labels[LABEL_BASE] == "nodekit/base:bookworm"
    assert labels[LABEL_VERSION] == "0.1.0"
    assert re.fullmatch(r"[0-9a-f]{64}", labels[LABEL_LOCK])
    args = dict(plan.build_args)
    assert args["BASE_IMAGE"] == "nodekit/base:bookworm"
    assert set(METADATA_ARGS) <= set(args)
    assert args["NODEKIT_FINGERPRINT"] == plan.fingerprint
    fp12 = plan.fingerprint[:12]
    assert plan.context == tmp_path / "stage" / fp12 / "launcher"
    assert plan.dockerfile == tmp_path / "stage" / fp12 / "Dockerfile"
    assert dict(plan.build_contexts) == {
        "code": tmp_path / "stage" / fp12 / "code",
        "wheels": tmp_path / "stage" / "wheels",
        "framework": tmp_path / "stage" / "framework",
        "cudalibs": tmp_path / "stage" / "cudalibs",
    }
    assert args["SOURCE_DATE_EPOCH"] == str(SOURCE_DATE_EPOCH)
    assert (plan.code_files, plan.code_bytes) == (1, 10)
    text = plan.describe()
    assert plan.tag in text and "build-arg BASE_IMAGE" in text


# --- the Dockerfile -----------------------------------------------------------------------------------------

DOCKERFILE = Path(__file__).resolve().parents[3] / "images" / "Dockerfile"


def instructions() -> list[str]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def stages() -> dict[str, list[str]]:
    """Each named stage's instructions (the unnamed last stage under "")."""
    out: dict[str, list[str]] = {}
    name = None
    for line in instructions():
        if line.startswith("FROM "):
            words = line.split()
            name = words[3] if len(words) == 4 and words[2] == "AS" else ""
            out[name] = []
        if name is not None:
            out[name].append(line)
    return out


def test_dockerfile_exports_each_package_layer_alone_installed_offline() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M)  # would pull a frontend image
    st = stages()
    # One stage per package layer nodekit exports (--target layer-<name> --output type=tar), each FROM scratch with
    # only the files of its layer copied in: the exported tree is exactly the layer.
    assert [p.target for p in PACKAGE_LAYERS] == ["layer-env", "layer-framework", "layer-packages"]
    for layer in PACKAGE_LAYERS:
        assert st[layer.target][0] == f"FROM scratch AS {layer.target}"
        assert all(i.startswith("COPY --from=") for i in st[layer.target][1:])
    assert st["layer-env"][1:] == ["COPY --from=env /opt/venv /opt/venv", "COPY --from=env /opt/nodekit /opt/nodekit",
                                   "COPY --from=env /workspace /workspace"]  # fmt: skip
    assert st["layer-framework"][1:] == ["COPY --from=framework-build /nodekit-layer/ /"]
    assert st["layer-packages"][1:] == ["COPY --from=packages-build /nodekit-layer/ /"]
    # The environment layer makes the venv with the CUDA libraries; framework and packages are each built on the
    # environment alone, from their own context only (each its own cache key), installing into /nodekit-layer.
    (cuda,) = [i for i in st["env"] if i.startswith("RUN")]
    (framework,) = [i for i in st["framework-build"] if i.startswith("RUN")]
    (packages,) = [i for i in st["packages-build"] if i.startswith("RUN")]
    assert st["framework-build"][0] == "FROM env AS framework-build"
    assert st["packages-build"][0] == "FROM env AS packages-build"
    for needle in ("--mount=type=bind,from=cudalibs", "/wheels/cudalibs.lock", "--no-index", "--require-hashes",
                   "--no-cache-dir", '"${BASE_PYTHON}" -m venv', "nodekit-base.pth", "ensurepip"):  # fmt: skip
        assert needle in cuda, needle
    for needle in ("--mount=type=bind,from=framework", "/wheels/framework.lock", "--root /nodekit-layer"):
        assert needle in framework, needle
    for needle in ("--mount=type=bind,from=wheels", "/wheels/packages.lock", "--root /nodekit-layer", "nodekit.lock"):
        assert needle in packages, needle
    for run in (cuda, framework, packages):
        assert "--require-hashes" in run and "--no-index" in run
    contexts = {"cudalibs": cuda, "framework": framework, "wheels": packages}
    for name, run in contexts.items():
        assert all(f"from={other}," not in run for other in contexts if other != name), name
    assert "-m venv" not in framework and "-m venv" not in packages


def test_the_image_by_hand_has_the_configuration_nodekit_writes() -> None:
    """nodekit writes the config itself (nodekit/image/layers.py) from IMAGE_ENV, WORKDIR, ENTRYPOINT and the
    labels; the Dockerfile's `image` and last stages say the same, so building it by hand gives the same image."""
    ins = instructions()
    env: dict[str, str] = {}
    for line in (i for i in ins if i.startswith("ENV ")):
        for word in line.split()[1:]:
            k, _, v = word.partition("=")
            env[k] = v
    assert {k: env[k] for k in IMAGE_ENV} == IMAGE_ENV
    assert f"WORKDIR {WORKDIR}" in ins
    assert f"ENTRYPOINT {json.dumps(list(ENTRYPOINT))}" in ins
    last = stages()[""]
    assert last[0] == "FROM image" and last[1] == "COPY --from=code . /workspace/"
    assert all(i.split()[0] in ("ARG", "LABEL", "ENV") for i in last[2:])
    assert last[-1] == "ENV NODEKIT_FINGERPRINT=${NODEKIT_FINGERPRINT}"
    assert {i.split()[1] for i in last if i.startswith("ARG")} == set(METADATA_ARGS)


# --- the base image ------------------------------------------------------------------------------------------


def test_plan_base_is_slim_and_reproducible(tmp_path: Path) -> None:
    from nodekit.image.debian import plan_base

    plan = plan_base("nodekit/base:bookworm", output=tmp_path / "rootfs.tar")
    assert plan.argv[:3] == ("mmdebstrap", "--variant=minbase", "--include=python3,python3-venv")
    assert plan.argv[-2:] == ("bookworm", str(tmp_path / "rootfs.tar"))
    for excluded in ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*"):
        assert f"--dpkgopt=path-exclude={excluded}" in plan.argv
    assert dict(plan.env) == {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    assert "docker load" in plan.describe()


def test_base_image_id_is_a_function_of_the_rootfs() -> None:
    """The id the engine gives the loaded base is sha256 of a config nodekit writes: known layer, known id.

    Layer and id are those of nodekit/base:bookworm made on the dev machine (docs/engine-notes.md).
    """
    import hashlib

    from nodekit.image.debian import image_config, plan_base

    plan = plan_base(output=Path("rootfs.tar"))
    config = image_config(plan, "72f0ea92df68f3a75f1c867b08b6f8d9e471654397662c4314246a647b3f7160")
    assert hashlib.sha256(config).hexdigest() == "7e121ebbddd1247c2bd3c35de45e36268de019219dfce38501b7cbf352c2355d"


# --- inspect: what the wheels in an image declare ------------------------------------------------------------


def test_stack_from_probe_reads_cuda_cudnn_nccl_from_wheel_metadata() -> None:
    from nodekit.image.builder import stack_from_probe
    from nodekit.image.lock import Lock, LockedPackage

    lock = Lock(
        python_version="3.11",
        platform="manylinux_2_36_x86_64",
        inputs=("torch==2.5.1",),
        packages=(
            LockedPackage(name="torch", version="2.5.1", hashes=("1" * 64,)),
            LockedPackage(name="nvidia-cudnn-cu12", version="9.1.0.70", hashes=("2" * 64,)),
            LockedPackage(name="nvidia-nccl-cu12", version="2.21.5", hashes=("3" * 64,)),
        ),
    )
    probe = {
        "python": "3.11.2",
        "dists": {"torch": "2.5.1", "nvidia-cudnn-cu12": "9.1.0.70", "nvidia-nccl-cu12": "2.20.0", "pip": "23.0.1"},
        "torch": {"__version__": "2.5.1", "cuda": "12.4", "hip": None},
        "lock": lock.text(),
    }
    found = stack_from_probe(probe)
    assert (found["python"], found["torch"], found["cuda"]) == ("3.11.2", "2.5.1", "12.4")
    assert (found["cudnn"], found["nccl"]) == ("9.1.0.70", "2.20.0")
    assert found["packages"] == {"nvidia-cudnn-cu12": "9.1.0.70", "nvidia-nccl-cu12": "2.21.5", "torch": "2.5.1"}
    assert found["not_as_locked"] == ("nvidia-nccl-cu12 (locked 2.21.5, installed 2.20.0)",)


def test_stack_from_probe_of_a_cpu_image_and_of_a_foreign_image() -> None:
    from nodekit.image.builder import stack_from_probe

    cpu = stack_from_probe({"python": "3.11.2", "dists": {"torch": "2.13.0+cpu"}, "torch": {"cuda": None}})
    assert (cpu["torch"], cpu["cuda"], cpu["cudnn"], cpu["nccl"]) == ("2.13.0+cpu", None, None, None)
    assert stack_from_probe({"python": "3.12.0", "dists": {}, "torch": {}, "lock": "not a lock"})["packages"] == {}


def test_the_lock_splits_into_the_cuda_libraries_framework_and_packages_layers() -> None:
    from nodekit.image.plan import split_lock

    lock = (
        "# nodekit.lock: header\n# python: 3.11\n# platform: manylinux_2_36_x86_64\n# input: torch==2.14.1\n\n"
        "cuda-bindings==13.5.0 --hash=sha256:c1\n"
        "filelock==4.2.11 --hash=sha256:aa\n"
        "numpy==2.4.6 --hash=sha256:bb\n"
        "nvidia-nccl-cu12==2.21.5 --hash=sha256:cc\n"
        "setuptools==84.2.1 --hash=sha256:b1\n"
        "torch==2.13.0+cpu --hash=sha256:dd\n"
        "torchvision==0.28.0 --hash=sha256:ee\n"
        "triton==3.5.0 --hash=sha256:ff\n"
        "torchmetrics==1.5.0 --hash=sha256:gg\n"
    )
    layers = split_lock(lock)

    def names(text: str) -> list[str]:
        return [ln.split("==")[0] for ln in text.splitlines() if ln and not ln.startswith("#")]

    assert names(layers.cuda_libs) == ["cuda-bindings", "nvidia-nccl-cu12", "setuptools"]
    assert names(layers.framework) == ["torch", "torchvision", "triton"]
    # torchmetrics is a package like any other: it changes with the project, not with torch.
    assert names(layers.packages) == ["filelock", "numpy", "torchmetrics"]
    assert layers.packages.startswith("# nodekit.lock: header\n# python: 3.11\n") and layers.packages.endswith(
        "sha256:gg\n"
    )
    for lower in (layers.cuda_libs, layers.framework):
        assert "# python: 3.11\n# platform: manylinux_2_36_x86_64\n" in lower and "# input:" not in lower
    empty = split_lock("# only comments\n")
    assert names(empty.cuda_libs) == names(empty.framework) == names(empty.packages) == []


def test_adding_a_package_leaves_the_lower_layers_files_byte_identical() -> None:
    """The CUDA libraries' and framework's lock files are the build contexts of their layers: when a package is
    added (the lock's header and packages change), they must not change, or BuildKit reinstalls gigabytes."""
    from nodekit.image.plan import split_lock

    head = "# nodekit.lock: header\n# python: 3.11\n# platform: manylinux_2_36_x86_64\n"
    pins = "nvidia-nccl-cu13==2.30.7 --hash=sha256:cc\ntorch==2.14.1 --hash=sha256:dd\n"
    before = split_lock(head + "# input: torch==2.14.1\n\n" + pins)
    after = split_lock(head + "# input: torch==2.14.1\n# input: six\n\n" + pins + "six==1.17.0 --hash=sha256:ee\n")
    assert (after.cuda_libs, after.framework) == (before.cuda_libs, before.framework)
    assert after.packages != before.packages


def test_a_torch_upgrade_that_keeps_its_cuda_libraries_changes_the_framework_layer_only() -> None:
    from nodekit.image.plan import split_lock

    head = "# python: 3.11\n# platform: manylinux_2_36_x86_64\n\n"
    libs = "nvidia-cudnn-cu13==9.24.0.43 --hash=sha256:c1\nnvidia-nccl-cu13==2.30.7 --hash=sha256:c2\n"
    old = split_lock(head + libs + "numpy==2.4.6 --hash=sha256:n1\ntorch==2.14.0 --hash=sha256:t0\n")
    new = split_lock(head + libs + "numpy==2.4.6 --hash=sha256:n1\ntorch==2.14.1 --hash=sha256:t1\n")
    assert new.cuda_libs == old.cuda_libs and new.framework != old.framework
