"""The Kubernetes manifests of nodekit k8s: golden files, strict schema validation (no API server can run here:
kubernetes-validate --strict for the Job, Service and Secret; kubeflow-trainer-api's models for the TrainJob), and
the contract with the launcher and with compose's environment.

Regenerate the golden files after an intended change with NODEKIT_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

from nodekit.backends.compose.render import render_compose
from nodekit.backends.k8s import plan as k8s
from nodekit.backends.k8s import render
from nodekit.config.settings import K8sSettings, Mount, Settings
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.launcher import contract
from nodekit.launcher import main as launcher_main
from nodekit.launcher.config import parse_env
from nodekit.launcher.preflight import network as netfacts
from nodekit.launcher.watchdog import run as watchdog
from nodekit.system.host.facts import HostFacts
from tests.golden import GOLDEN, update_golden

PROJECT = Path("/srv/project")
FP = "0123456789ab" + "cd" * 26
IMAGE = f"registry.example.com/ml/demo:{FP[:12]}"
SECRET = "s3cr3t-value-0123456789"


def cpu_settings(**kw: Any) -> Settings:
    base: dict[str, Any] = {"name": "demo", "script": "train.py", "args": ("--epochs", "3"), "nnodes": 2}
    return Settings(project_dir=PROJECT, **(base | kw))


def gpu_settings(**k8s_kw: Any) -> Settings:
    return cpu_settings(
        nnodes=4,
        mounts=(
            Mount(host="/mnt/imagenet", container="/data", check="sizes"),
            Mount(host="/opt/ref", container="/ref"),
            Mount(host="/scratch", container="/scratch", writable=True),
        ),
        env={"NCCL_DEBUG": "WARN"},
        pass_env=("WANDB_API_KEY",),
        k8s=K8sSettings(
            **{
                "namespace": "ml-team",
                "gpus": 8,
                "shm_size": "64Gi",
                "claims": {"/data": "imagenet", "/outputs": "runs"},
                "image_pull_secret": "regcred",
                "backoff_limit": 1,
            }
            | k8s_kw
        ),
    )


def planned(s: Settings, kind: k8s.Kind = "job") -> k8s.K8sPlan:
    return k8s.plan_k8s(s, image=IMAGE, fingerprint=FP, secret=SECRET, kind=kind, out_dir=Path("k8s"))


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def job_of(p: k8s.K8sPlan) -> dict[str, Any]:
    return docs(p.files[0].text)[1]


def pod_of(p: k8s.K8sPlan) -> dict[str, Any]:
    spec: dict[str, Any] = job_of(p)["spec"]["template"]["spec"]
    return spec


CASES = {
    "k8s-job-cpu.yaml": (cpu_settings(nproc_per_node=1), "job"),
    "k8s-job-gpu.yaml": (gpu_settings(host_network=True), "job"),
    "k8s-trainjob-gpu.yaml": (gpu_settings(), "trainjob"),
}


@pytest.mark.parametrize("golden", sorted(CASES))
def test_golden(golden: str) -> None:
    s, kind = CASES[golden]
    text = planned(s, kind).files[0].text  # type: ignore[arg-type]
    path = GOLDEN / golden
    update_golden(path, text)
    assert text == path.read_text()


@pytest.mark.parametrize("version", k8s.K8S_VERSIONS)
@pytest.mark.parametrize("golden", ["k8s-job-cpu.yaml", "k8s-job-gpu.yaml"])
def test_every_manifest_validates_strictly(golden: str, version: str) -> None:
    s, kind = CASES[golden]
    p = planned(s, kind)  # type: ignore[arg-type]
    found = [d for f in p.files for d in docs(f.text)]
    assert [d["kind"] for d in found] == ["Service", "Job", "Secret"]
    for doc in found:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_what_kubernetes_would() -> None:
    # The validator is really strict: a key the API does not know, deep in the pod, is refused.
    job = job_of(planned(cpu_settings()))
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, k8s.K8S_VERSIONS[0], strict=True)
    # And a wrong type. (The schemas carry no enums: values such as a rule's action are asserted by the tests
    # below, against what the Kubernetes documentation allows.)
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, k8s.K8S_VERSIONS[0], strict=True)


def trainjob_roundtrip(doc: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob through Trainer's models; a key they do not know is dropped on the way back."""
    model = TrainerV1alpha1TrainJob.from_dict(doc)
    assert model is not None
    back: dict[str, Any] = model.to_dict()
    return back


def test_the_trainjob_validates_with_trainers_models() -> None:
    p = planned(gpu_settings(), "trainjob")
    (doc,) = docs(p.files[0].text)
    assert trainjob_roundtrip(doc) == doc
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    trainer = doc["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 8}}
    env = {e["name"]: e for e in trainer["env"]}
    assert env["MASTER_ADDR"]["value"] == "demo-node-0-0.demo"  # JobSet's name for pod 0 of replicated job "node"
    # The check is a real one: an unknown key does not survive the models.
    bad = copy.deepcopy(doc)
    bad["spec"]["trainer"]["gpus"] = 8
    assert trainjob_roundtrip(bad) != bad


def test_the_job_is_indexed_and_pod_0_is_main_by_its_dns_name() -> None:
    p = planned(gpu_settings())
    svc, job = docs(p.files[0].text)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] == job["metadata"]["name"] == "demo"
    assert svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["restartPolicy"] == "Never"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "demo-0.demo"  # <job>-<index>.<service>
    annotation = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["NODE_RANK"]["valueFrom"] == {"fieldRef": {"fieldPath": annotation}}
    assert env["NODEKIT_RESOLVE_MAIN"]["value"] == "1"


def test_gpus_shm_and_networking() -> None:
    pod = pod_of(planned(gpu_settings()))
    (c,) = pod["containers"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert "hostNetwork" not in pod  # off unless asked for
    on = pod_of(planned(gpu_settings(host_network=True)))
    assert on["hostNetwork"] is True and on["dnsPolicy"] == "ClusterFirstWithHostNet"
    cpu = pod_of(planned(cpu_settings()))
    assert "resources" not in cpu["containers"][0]


def test_mounts_are_claims_or_host_paths_as_configured() -> None:
    pod = pod_of(planned(gpu_settings()))
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert vols[mounts["/data"]["name"]]["persistentVolumeClaim"] == {"claimName": "imagenet", "readOnly": True}
    assert vols[mounts["/outputs"]["name"]]["persistentVolumeClaim"] == {"claimName": "runs", "readOnly": False}
    assert vols[mounts["/ref"]["name"]]["hostPath"] == {"path": "/opt/ref", "type": "Directory"}
    assert mounts["/ref"]["readOnly"] is True and mounts["/scratch"]["readOnly"] is False
    assert vols[mounts["/outputs"]["name"]] != {} and "emptyDir" in pod_of(planned(cpu_settings()))["volumes"][1]


def test_exit_codes_map_to_the_launchers() -> None:
    (rule,) = job_of(planned(cpu_settings()))["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    # Every refusal a retried pod would meet again, and the codes of a node that stopped with the others (19, 22).
    codes = {launcher_main.EXIT_BAD_ENV, launcher_main.EXIT_STACK_MISMATCH, watchdog.EXIT_PEER_LOST,
             contract.EXIT_LINK, contract.EXIT_GPU, contract.EXIT_STALLED}  # fmt: skip
    assert rule["onExitCodes"] == {"containerName": "train", "operator": "In", "values": sorted(codes)}
    assert job_of(planned(cpu_settings()))["spec"]["backoffLimit"] == 0
    assert job_of(planned(gpu_settings()))["spec"]["backoffLimit"] == 1


def test_labels_name_the_fingerprint() -> None:
    job = job_of(planned(cpu_settings()))
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["nodekit/fingerprint"] == FP[:12]
    assert job["metadata"]["annotations"]["nodekit/fingerprint"] == FP


def test_the_pod_environment_is_composes_but_for_rank_main_and_the_secret() -> None:
    s = gpu_settings()
    facts = HostFacts(gpu_count=8)
    node = node_spec(s, launch_spec(s), 0, "10.0.0.5", facts)
    compose_env = render_compose(
        plan_container(node, facts, image=IMAGE, output_dir=Path("/o"), job_secret=True),
        secrets={"NODEKIT_JOB_SECRET": SECRET},
    )["services"]["train"]["environment"]
    pod_env = {e["name"]: e for e in pod_of(planned(s))["containers"][0]["env"]}
    assert set(pod_env) == set(compose_env) | {"NODEKIT_RESOLVE_MAIN"}
    by_value = {k for k, e in pod_env.items() if "value" in e}
    same = by_value - {"MASTER_ADDR", "NODEKIT_RESOLVE_MAIN"}
    assert {k: pod_env[k]["value"] for k in same} == {k: compose_env[k] for k in same}
    assert set(pod_env) - by_value == {"NODE_RANK", "NODEKIT_JOB_SECRET", "WANDB_API_KEY"}


def test_secrets_are_referenced_never_inline() -> None:
    p = planned(gpu_settings())
    job_text = p.files[0].text
    assert SECRET not in job_text
    env = {e["name"]: e for e in pod_of(p)["containers"][0]["env"]}
    ref = {"name": "demo-job-secret", "key": "job-secret"}
    assert env["NODEKIT_JOB_SECRET"] == {"name": "NODEKIT_JOB_SECRET", "valueFrom": {"secretKeyRef": ref}}
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-env",
        "key": "WANDB_API_KEY",
        "optional": True,
    }
    (secret_doc,) = docs(p.files[1].text)
    assert secret_doc["kind"] == "Secret" and secret_doc["stringData"] == {"job-secret": SECRET}
    assert SECRET not in p.files[1].shown


def test_a_pod_environment_starts_the_launcher() -> None:
    # What a pod of rank 2 sees once Kubernetes filled in the references; the launcher resolves pod 0's name.
    s = gpu_settings()
    env = {e["name"]: e.get("value", "") for e in pod_of(planned(s))["containers"][0]["env"]}
    env |= {"NODE_RANK": "2", "NODEKIT_JOB_SECRET": SECRET, "WANDB_API_KEY": "k", "GLOO_SOCKET_IFNAME": "eth0"}
    asked: list[str] = []

    def dns(name: str) -> list[str]:
        asked.append(name)
        return ["10.244.3.9"]

    env |= netfacts.resolve(env, find=dns, log=lambda line: None)
    cfg = parse_env(env)
    assert asked == ["demo-0.demo"]
    assert (cfg.master_addr, cfg.node_rank, cfg.nnodes, cfg.nproc_per_node) == ("10.244.3.9", 2, 4, 8)
    assert cfg.job_secret == SECRET and cfg.data_check == (("/data", "sizes"),)


def test_one_pod_template_means_one_node_shape() -> None:
    from nodekit.config.settings import NodeOverride
    from nodekit.errors import UsageError

    hetero = cpu_settings(nodes={1: NodeOverride(gpus=4)}, k8s=K8sSettings(gpus=8))
    with pytest.raises(UsageError, match="different GPU counts"):
        planned(hetero)
    agreed = cpu_settings(nodes={0: NodeOverride(gpus=4), 1: NodeOverride(gpus=4)})
    assert planned(agreed).job.gpus == 4 and planned(agreed).job.nproc == 4  # auto = the GPUs
    with pytest.raises(UsageError, match="different nproc_per_node"):
        planned(cpu_settings(nodes={1: NodeOverride(nproc_per_node=2)}))
    per_node = cpu_settings(
        mounts=(Mount(host="/a", container="/data"),), nodes={1: NodeOverride(mounts={"/data": "/b"})}
    )
    with pytest.raises(UsageError, match="one pod template"):
        planned(per_node)
    claimed = per_node.model_copy(update={"k8s": K8sSettings(claims={"/data": "shared"})})
    assert planned(claimed).job.volumes[1].kind == "pvc"


def test_a_trainjob_name_leaves_room_for_jobsets_pod_names() -> None:
    from nodekit.errors import UsageError

    name = "a" * 55  # fits "-0" .. "-3" but not "-node-0-3"
    planned(cpu_settings(nnodes=4, k8s=K8sSettings(name=name)))
    with pytest.raises(UsageError, match="at most 54 characters"):
        planned(cpu_settings(nnodes=4, k8s=K8sSettings(name=name)), "trainjob")
    assert render.K8sJob.model_fields["name"].is_required()


def test_notes_say_what_does_not_carry_over() -> None:
    from nodekit.config.settings import NodeOverride

    s = cpu_settings(network="bridge", nodes={1: NodeOverride(iface="ens5")}, pass_env=("HF_TOKEN",))
    p = k8s.plan_k8s(s, image="nodekit/demo:1", fingerprint="", secret=SECRET, kind="job", out_dir=Path("k8s"))
    text = "\n".join(p.notes)
    for needle in (
        "names no registry",
        "no nodekit/fingerprint label",
        "/outputs is an emptyDir",
        "bridge",
        "[nodes.R] iface and addr are ignored",
        "Secret demo-env",
    ):
        assert needle in text
    assert "nodekit/fingerprint" not in job_of(p)["metadata"]["labels"]
