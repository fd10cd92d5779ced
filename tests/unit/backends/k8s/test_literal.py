"""Values reach a pod as written: Kubernetes expands ``$(VAR)`` in a container's command, args and env values and
turns ``$$`` into ``$`` (issue 28). The golden file carries the decoys compose's golden has (node-0-literal.yaml),
plus Kubernetes' own ``$(VAR)``; each is then read back the way Kubernetes reads it and compared with the value the
user wrote."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from nodekit.backends.k8s import plan as k8s
from nodekit.backends.k8s import render
from nodekit.config.settings import Settings
from tests.golden import GOLDEN, update_golden

ARGS = ("--name", "exp-$USER-${RUN:-default}", "cost=$HOME", "$$", "a'b\"c d", "ünï", "tail\\", "$(MASTER_PORT)")
ENV = {"EXPERIMENT": "exp-$USER-${RUN:-default}", "PRICE": "$5 and $$", "PORT": "$(MASTER_PORT)", "ESC": "$$(X)"}
DECOYS: dict[str, Any] = {
    "args": ARGS,
    "env": ENV,
    "pass_env": ("HF_TOKEN",),
    "mounts": ({"host": "/srv/$DATA/${X:-y}", "container": "/data/$1 ü\\", "check": "sizes"},),
}


def settings() -> Settings:
    base: dict[str, Any] = {"name": "demo", "script": "train.py", "nnodes": 2, "nproc_per_node": 1}
    return Settings(project_dir=Path("/srv/project"), **(base | DECOYS))


def planned(kind: k8s.Kind) -> k8s.K8sPlan:
    return k8s.plan_k8s(
        settings(), image="r.example.com/demo:1", fingerprint="", secret="s" * 16, kind=kind, out_dir=Path("k8s")
    )


def expand(value: str, defined: dict[str, str]) -> str:
    """What the kubelet makes of a value (k8s.io/kubernetes third_party/forked/golang/expansion): ``$$`` is ``$``,
    ``$(NAME)`` of a defined variable is its value, anything else stays."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        found = re.match(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", value[i:])
        if found and found.group(1) in defined:
            out.append(defined[found.group(1)])
            i += found.end()
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


def test_golden() -> None:
    text = planned("job").files[0].text
    path = GOLDEN / "k8s-job-literal.yaml"
    update_golden(path, text)
    assert text == path.read_text()


def test_every_value_reaches_the_pod_as_written() -> None:
    for kind in ("job", "trainjob"):
        doc = [d for d in yaml.safe_load_all(planned(kind).files[0].text) if d][-1]
        if kind == "job":
            c = doc["spec"]["template"]["spec"]["containers"][0]
            args, env = c["args"], c["env"]
        else:
            args, env = doc["spec"]["trainer"]["args"], doc["spec"]["trainer"]["env"]
            assert [expand(a, {}) for a in doc["spec"]["trainer"]["command"]] == list(render.ENTRYPOINT)
        values = {e["name"]: e["value"] for e in env if "value" in e}
        # Every variable of the pod is defined when Kubernetes expands: the worst case for a stray $(NAME).
        defined = {**values, "MASTER_PORT": "29500", "X": "x"}
        assert [expand(a, defined) for a in args] == ["train.py", *ARGS], kind
        assert {k: expand(values[k], defined) for k in ENV} == ENV, kind
        assert expand(values["NODEKIT_DATA_CHECK"], defined) == "/data/$1 ü\\:sizes"
