"""`serve --api dynamo --launcher k8s`: a DynamoGraphDeployment (nvidia.com/v1beta1) for NVIDIA
Dynamo's Kubernetes operator, aggregated: a Frontend component and a TRTLLMWorker component of
`parallel.replicas` workers, the engine-args YAML in a ConfigMap, the deployment and the
checkpoints it serves on a PersistentVolumeClaim mounted where they are here (the worker's --model
and the YAML's speculative_model name them by absolute path; the frontend reads the tokenizer the
worker registers by that path too), a node's GPUs in resources.limits.

Upstream facts it follows (recipe/dynamo.py): the CRD's v1beta1 schema (components[]: name, type,
replicas, multinode.nodeCount, runtimeVersionOverride, podTemplate with a container named `main`)
and the shape of the ai-dynamo 1.6.1 wheel's own template dynamo/profiler/templates/dgd/trtllm/
agg.yaml (component names, `python3 -m dynamo.frontend` as command python3 with args, the worker
as command `python3 -m dynamo.trtllm` with its flags as args, `nvidia.com/gpu` as a string). A
worker wider than a node is a multinode component of `nodeCount` pods: the operator starts its MPI
world (the pattern of Dynamo's examples/backends/trtllm/deploy/v1beta1/disagg-multinode.yaml; what
1.6.1's operator runs there is unconfirmed). The operator sets the discovery backend and the ports.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from trtllm_dflash.launch.cluster_job import ClusterOptions, Job, claim_root, storage_note
from trtllm_dflash.launch.dynamo import DynamoLaunch, with_flag
from trtllm_dflash.launch.kubernetes import BlockDumper
from trtllm_dflash.recipe import dynamo

ENGINE_ARGS_MOUNT = "/etc/trtllm-dflash/dynamo"  # the ConfigMap's mount in the worker pods
ENGINE_ARGS_KEY = "engine_args.yaml"
FRONTEND, WORKER = "Frontend", "TRTLLMWorker"  # the wheel's template names them so
SEMVER_TAG = re.compile(r"^\d+\.\d+\.\d+$")


def runtime_version(image: str) -> dict:
    """runtimeVersionOverride where the image tag is no MAJOR.MINOR.PATCH version (DGD admission
    requires it then): the Dynamo release the flags were written for."""
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    return {} if SEMVER_TAG.match(tag) else {"runtimeVersionOverride": dynamo.version()}


def _claim(job: Job, opts: ClusterOptions) -> tuple[dict, dict]:
    """(volume, mount) of the claim holding the served directories, read-only."""
    claim = {"claimName": opts.pvc or f"{job.name}-runs", "readOnly": True}
    return ({"name": "runs", "persistentVolumeClaim": claim},
            {"name": "runs", "mountPath": str(claim_root(job, opts)), "readOnly": True})


def frontend(job: Job, launch: DynamoLaunch, opts: ClusterOptions, image: str) -> dict:
    volume, mount = _claim(job, opts)
    args = ["-m", "dynamo.frontend", *dynamo.checked("frontend", ["--router-mode", launch.router])]
    container = {"name": "main", "image": image, "command": ["python3"], "args": args, "volumeMounts": [mount]}
    return {"name": FRONTEND, "type": "frontend", "replicas": 1, **runtime_version(image),
            "podTemplate": {"spec": {"containers": [container], "volumes": [volume]}}}


def worker(job: Job, launch: DynamoLaunch, opts: ClusterOptions, image: str) -> dict:
    """One pod per node of a worker (multinode past one node), `replicas` workers."""
    volume, mount = _claim(job, opts)
    args = dynamo.checked("worker", with_flag(launch.worker, "--extra-engine-args",
                                              f"{ENGINE_ARGS_MOUNT}/{ENGINE_ARGS_KEY}"))
    container = {"name": "main", "image": image, "command": ["python3", "-m", "dynamo.trtllm"], "args": args,
                 "resources": {"limits": {"nvidia.com/gpu": str(job.where.gpus_per_node)}},
                 "volumeMounts": [mount, {"name": "engine-args", "mountPath": ENGINE_ARGS_MOUNT, "readOnly": True}]}
    volumes = [volume, {"name": "engine-args", "configMap": {"name": f"{job.name}-engine-args"}}]
    out = {"name": WORKER, "type": "worker", "replicas": job.where.replicas, **runtime_version(image),
           "podTemplate": {"spec": {"containers": [container], "volumes": volumes}}}
    if job.where.nodes > 1:
        out["multinode"] = {"nodeCount": job.where.nodes}
    return out


def graph_deployment(job: Job, launch: DynamoLaunch, opts: ClusterOptions, image: str) -> dict:
    return {
        "apiVersion": dynamo.DGD_API,
        "kind": dynamo.DGD_KIND,
        "metadata": {"name": job.name, "labels": {"app.kubernetes.io/name": "trtllm-dflash"},
                     "annotations": {"trtllm-dflash/shared-storage": storage_note("k8s", job, opts)}},
        "spec": {"backendFramework": "trtllm",
                 "components": [frontend(job, launch, opts, image), worker(job, launch, opts, image)]},
    }


def engine_args_config_map(job: Job, launch: DynamoLaunch) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{job.name}-engine-args", "labels": {"app.kubernetes.io/name": "trtllm-dflash"}},
            "data": {ENGINE_ARGS_KEY: launch.engine_args.read_text()}}


def dgd_manifest(job: Job, launch: DynamoLaunch, opts: ClusterOptions, image: str, path: Path) -> str:
    """The ConfigMap and the DynamoGraphDeployment as one YAML stream, for `kubectl apply -f PATH`."""
    w = job.where
    head = [f"Generated by `trtllm-dflash serve --api dynamo --launcher k8s` from recipe {job.recipe!r} "
            f"(pytorch backend), for NVIDIA Dynamo {dynamo.version()}'s operator (nvidia.com/v1beta1).",
            f"Aggregated: one {FRONTEND} (router {launch.router}) and {w.replicas} {WORKER} worker(s) "
            f"(parallel.replicas), each {w.nodes} pod(s) x {w.gpus_per_node} GPU(s).",
            f"Router: {launch.router_why}.",
            "Disaggregated prefill/decode is not written: DFlash does not survive it in TensorRT-LLM (#17264).",
            f"Shared storage: {storage_note('k8s', job, opts)}.",
            f"Apply: kubectl apply -f {shlex.quote(str(path))}"]
    docs = yaml.dump_all([engine_args_config_map(job, launch), graph_deployment(job, launch, opts, image)],
                         Dumper=BlockDumper, sort_keys=False)
    return "".join(f"# {line}\n" for line in head) + docs
