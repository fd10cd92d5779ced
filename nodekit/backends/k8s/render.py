"""Pure: the Kubernetes manifests of one job, from a validated :class:`K8sJob` (built by
``nodekit/backends/k8s/plan.py``).

A headless Service and an Indexed Job (``completionMode: Indexed``, no operator needed), or a Kubeflow Trainer
``TrainJob`` for clusters that run Trainer; and the Secret holding the job secret. Every pod runs the image's own
entrypoint (the launcher) in the container the job's :class:`~nodekit.job.container.ContainerSpec` describes, its
holes filled by the pod: NODE_RANK is the pod's completion index (through the downward API), MASTER_ADDR pod 0's
DNS name (which the launcher resolves in the pod: NODEKIT_RESOLVE_MAIN=1), and NODEKIT_IMAGE_ID is left out (the
pods pull the image by name; preflight still compares its fingerprint).

Kubernetes expands ``$(VAR)`` in a container's command, args and env values, and turns ``$$`` into ``$``: every
``$`` there is written ``$$`` (:func:`literal`), so each value reaches the job as written.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel

from nodekit import __version__
from nodekit.job.container import IMAGE_ID, MAIN_ADDR, RANK, ContainerSpec
from nodekit.launcher.contract import (
    EXIT_BAD_ENV,
    EXIT_GPU,
    EXIT_LINK,
    EXIT_PEER_LOST,
    EXIT_STACK_MISMATCH,
    EXIT_STALLED,
    Env,
)
from nodekit.system.frozen import FROZEN

CONTAINER = "train"
TRAINJOB_CONTAINER = "node"  # the container (and replicated job) of Trainer's torch runtimes
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
SECRET_KEY = "job-secret"
LABEL_PREFIX = "nodekit/"
GPU_RESOURCE = "nvidia.com/gpu"
# The launcher's exit codes (nodekit/launcher/__init__.py) that a retry of one pod cannot fix: 2 bad input, 17 stack
# mismatch, 20 the link check and 21 the GPU health check refused (the same nodes refuse again); and 19 (another
# node was lost or failed) and 22 (the job stalled, every node stops): Kubernetes would replace only that pod, which
# would rejoin the rendezvous still held by pod 0 (main keeps its store up to peer_timeout + 45 s), be refused as a
# rank claimed twice (17) and hide the real cause. The pod that failed first is the one to read (its own code counts).
FAIL_JOB_EXIT_CODES = (EXIT_BAD_ENV, EXIT_STACK_MISMATCH, EXIT_PEER_LOST, EXIT_LINK, EXIT_GPU, EXIT_STALLED)
# The image's ENTRYPOINT (images/Dockerfile), spelled out where a runtime's own command would replace it.
ENTRYPOINT = ("/opt/venv/bin/python", "-m", "nodekit.launcher")


class Volume(BaseModel):
    """One volume of the pod: where it is mounted and what backs it."""

    model_config = FROZEN

    name: str
    mount_path: str
    kind: Literal["hostPath", "pvc", "emptyDir"]
    source: str = ""  # the host path (hostPath) or the claim's name (pvc)
    read_only: bool = False


class K8sJob(BaseModel):
    """Everything the manifests say, validated: names are DNS labels, counts in range
    (``nodekit/backends/k8s/plan.py``)."""

    model_config = FROZEN | {"arbitrary_types_allowed": True}

    name: str  # the Job, its headless Service (the pods' subdomain) and the TrainJob
    namespace: str | None
    image: str
    fingerprint: str  # "" when unknown
    nnodes: int
    nproc: int
    gpus: int
    container: ContainerSpec  # node 0's, its holes filled by each pod
    ports: tuple[int, int]  # master_port, preflight_port
    volumes: tuple[Volume, ...]
    host_network: bool = False
    shm_size: str | None = None
    pull_secret: str | None = None
    backoff_limit: int = 0
    runtime: str = "torch-distributed"

    @property
    def secret_name(self) -> str:
        return f"{self.name}-job-secret"

    @property
    def env_secret_name(self) -> str:
        """The Secret the pass_env variables are read from (created by the user: nodekit never holds them)."""
        return f"{self.name}-env"


def labels(job: K8sJob) -> dict[str, str]:
    out = {"app.kubernetes.io/name": job.name, "app.kubernetes.io/managed-by": "nodekit"}
    if job.fingerprint:
        out[LABEL_PREFIX + "fingerprint"] = job.fingerprint[:12]  # as the image tag; a label value holds 63
    return out | {LABEL_PREFIX + "nnodes": str(job.nnodes), LABEL_PREFIX + "version": __version__}


def _meta(job: K8sJob, name: str, *, annotate: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if job.namespace:
        meta["namespace"] = job.namespace
    meta["labels"] = labels(job)
    if annotate and job.fingerprint:
        meta["annotations"] = {LABEL_PREFIX + "fingerprint": job.fingerprint}
    return meta


def literal(value: str) -> str:
    """``value`` as Kubernetes reads it back from a container's command, args or env: ``$$`` is one ``$``, so
    nothing of the form ``$(VAR)`` is expanded."""
    return value.replace("$", "$$")


def pod_env(job: K8sJob, main: str) -> list[dict[str, Any]]:
    """The container's environment, its holes filled by the pod: main by ``main`` (pod 0's DNS name, resolved in
    the pod), the rank by the pod's completion index; secrets by reference, never by value."""
    env: list[dict[str, Any]] = []
    for v in job.container.env:
        if v.value == MAIN_ADDR:
            env.append({"name": v.name, "value": main})
        elif v.value == RANK:
            rank = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}
            env.append({"name": v.name, "valueFrom": rank})
        elif v.value == IMAGE_ID:
            continue  # the pods pull the image by name: its id is not known here
        elif isinstance(v.value, str):
            env.append({"name": v.name, "value": literal(v.value)})
        else:
            raise ValueError(f"a pod cannot fill {v.value}")  # a new hole must not pass silently
    env.append({"name": Env.RESOLVE_MAIN, "value": "1"})
    keys = {Env.JOB_SECRET: SECRET_KEY}
    env += [
        {"name": n, "valueFrom": {"secretKeyRef": {"name": job.secret_name, "key": keys[n]}}}
        for n in job.container.secrets
    ]
    ref = {"name": job.env_secret_name, "optional": True}
    env += [{"name": n, "valueFrom": {"secretKeyRef": ref | {"key": n}}} for n in job.container.pass_env]
    return env


def volumes(job: K8sJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts: /dev/shm in memory (Docker's 64 MB default is what compose's
    ``ipc: host`` avoids), then /outputs and the [[mounts]] as configured."""
    shm: dict[str, Any] = {"medium": "Memory"} | ({"sizeLimit": job.shm_size} if job.shm_size else {})
    vols: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for v in job.volumes:
        if v.kind == "pvc":
            vols.append({"name": v.name, "persistentVolumeClaim": {"claimName": v.source, "readOnly": v.read_only}})
        elif v.kind == "hostPath":
            # Directory: a missing dataset is an error on that node, never an empty directory made for it.
            vols.append({"name": v.name, "hostPath": {"path": v.source, "type": "Directory"}})
        else:
            vols.append({"name": v.name, "emptyDir": {}})
        mounts.append({"name": v.name, "mountPath": v.mount_path, "readOnly": v.read_only})
    return vols, mounts


def _resources(job: K8sJob) -> dict[str, Any]:
    return {"limits": {GPU_RESOURCE: job.gpus}} if job.gpus else {}


def service(job: K8sJob) -> dict[str, Any]:
    """Headless: it only gives every pod a DNS name (``<job>-<index>.<service>``), published before the pods are
    ready so that the others find pod 0 as soon as it has an address."""
    names = ("rendezvous", "preflight")
    ports = [{"name": n, "port": p, "protocol": "TCP"} for n, p in zip(names, job.ports, strict=True)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, job.name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_PREFIX + "job": job.name},
            "ports": ports,
        },
    }


def indexed_job(job: K8sJob) -> dict[str, Any]:
    vols, mounts = volumes(job)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": job.image,
        "imagePullPolicy": "IfNotPresent",
        # No command: the image's ENTRYPOINT is the launcher, as under compose; these are its arguments.
        "args": [literal(a) for a in job.container.command],
        "workingDir": job.container.workdir,
        # Pod 0's DNS name: ``<job>-<index>`` is an indexed pod's hostname, the headless Service its subdomain.
        "env": pod_env(job, f"{job.name}-0.{job.name}"),
        "volumeMounts": mounts,
    }
    if job.gpus:
        container["resources"] = _resources(job)
    pod: dict[str, Any] = {
        "subdomain": job.name,
        "restartPolicy": "Never",
        # The pause container becomes PID 1 and reaps orphans, as compose's `init: true` does with tini; the
        # launcher (or the user's script in launcher "env") would otherwise ignore SIGTERM as PID 1.
        "shareProcessNamespace": job.container.init,
        "terminationGracePeriodSeconds": job.container.stop_grace_s,
    }
    if job.host_network:
        # ClusterFirstWithHostNet: a pod on the node's network still resolves the cluster's names (pod 0's).
        pod |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    if job.pull_secret:
        pod["imagePullSecrets"] = [{"name": job.pull_secret}]
    pod |= {"containers": [container], "volumes": vols}
    rule = {"containerName": CONTAINER, "operator": "In", "values": list(FAIL_JOB_EXIT_CODES)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(job, job.name, annotate=True),
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nnodes,
            "parallelism": job.nnodes,
            "backoffLimit": job.backoff_limit,
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": rule}]},
            "template": {
                "metadata": {"labels": labels(job) | {LABEL_PREFIX + "job": job.name}},
                "spec": pod,
            },
        },
    }


def job_secret(job: K8sJob, value: str) -> dict[str, Any]:
    """The Secret every pod reads NODEKIT_JOB_SECRET from (its file is written 0600, and printed masked)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, job.secret_name),
        "type": "Opaque",
        "stringData": {SECRET_KEY: value},
    }


def train_job(job: K8sJob) -> dict[str, Any]:
    """A Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1) of the same job, on a torch runtime.

    The runtime owns the JobSet (its headless Service, restart and failure policy); the launcher replaces the
    runtime's torchrun command, and the pod's volumes come through a runtime patch."""
    vols, mounts = volumes(job)
    trainer: dict[str, Any] = {
        "image": job.image,
        # The image's ENTRYPOINT, spelled out: a runtime's own command (torchrun) would replace it otherwise.
        "command": [literal(a) for a in ENTRYPOINT],
        "args": [literal(a) for a in job.container.command],
        "numNodes": job.nnodes,
        "numProcPerNode": job.nproc,
        # Pod 0's DNS name: JobSet names pods ``<jobset>-<replicated job>-<job index>-<pod index>``.
        "env": pod_env(job, f"{job.name}-{TRAINJOB_CONTAINER}-0-0.{job.name}"),
    }
    if job.gpus:
        trainer["resourcesPerNode"] = _resources(job)
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": job.container.stop_grace_s}
    if job.pull_secret:
        pod["imagePullSecrets"] = [{"name": job.pull_secret}]
    pod |= {"volumes": vols, "containers": [{"name": TRAINJOB_CONTAINER, "volumeMounts": mounts}]}
    replicated = {"name": TRAINJOB_CONTAINER, "template": {"spec": {"template": {"spec": pod}}}}
    patch = {"manager": "nodekit", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _meta(job, job.name, annotate=True),
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": job.runtime},
            "trainer": trainer,
            "runtimePatches": [patch],
        },
    }


def to_yaml(docs: list[dict[str, Any]], header: str) -> str:
    """``header`` (comment lines) and the documents, separated by ``---``."""
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False) for d in docs)
    return header + body
