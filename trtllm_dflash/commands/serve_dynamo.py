"""`serve --api dynamo` on the pytorch backend: NVIDIA Dynamo's frontend and TensorRT-LLM workers
over the deployment (launch/dynamo.py).

  --launcher single_node | mpirun   print (--run: run) the shell script that starts the frontend
                                    and every worker on this node (--container IMAGE: inside
                                    `docker run IMAGE`, all of them in the one container)
  --launcher srun                   write a Slurm batch script (launch/dynamo_slurm.py)
  --launcher k8s                    write a DynamoGraphDeployment and its ConfigMap
                                    (launch/dynamo_k8s.py)
--disaggregation-mode takes Dynamo's values; anything but agg is refused, naming why.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from trtllm_dflash.errors import UserError

CLUSTER_SUFFIX = {"srun": "-dynamo.sbatch", "k8s": "-dgd.yaml"}
HAS_WORKER = "import importlib.util, sys; sys.exit(importlib.util.find_spec('dynamo.trtllm') is None)"
TRTLLM_VERSION = "import importlib.metadata as m; print(m.version('tensorrt_llm'))"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from trtllm_dflash.recipe import dynamo

    g = p.add_argument_group("--api dynamo (pytorch backend)")
    g.add_argument("--disaggregation-mode", choices=dynamo.choices("worker", "--disaggregation-mode"), default=None,
                   help="Dynamo's worker mode; only agg (aggregated, the default) serves DFlash: disaggregated "
                   "prefill/decode is refused (TensorRT-LLM #17264)")


def run(args: argparse.Namespace, recipe, endpoints) -> int:
    from trtllm_dflash.launch.dynamo import disaggregation_problem, read_launch

    problem = disaggregation_problem(args.disaggregation_mode)
    if problem:
        raise UserError(problem)
    if args.runners is not None:
        raise UserError(f"--runners {args.runners}: --api dynamo serves the pytorch backend's TensorRT-LLM workers")
    launch = read_launch(recipe, args.from_dir)
    if args.launcher in CLUSTER_SUFFIX:
        return _cluster(args, recipe, launch, endpoints)
    return _one_node(args, recipe, launch, endpoints)


def _one_node(args, recipe, launch, endpoints) -> int:
    from trtllm_dflash.launch.dynamo import carried, one_node_script
    from trtllm_dflash.launch.node_command import in_container, served_paths

    if not args.container:  # the script runs in the user's Dynamo image: the pinned release's, we assume
        carried(recipe, "--container")
    script = one_node_script(launch, endpoints.host, endpoints.http_port, endpoints.metrics_port,
                             mpirun=args.launcher == "mpirun")
    cmd = ["bash", "-c", script]
    if args.container:
        cmd = in_container(cmd, args.container, served_paths(args.from_dir))
        print(shlex.join(cmd))
    else:
        print(script, end="")
    if not args.execute:
        return 0
    if args.container and shutil.which("docker") is None:
        raise UserError("docker: not found on PATH; run the script inside the Dynamo container instead")
    if not args.container:
        _check_here(recipe)
    sys.stdout.flush()
    return subprocess.call(cmd)


def _check_here(recipe) -> None:
    """--run without --container: this machine's Dynamo worker and TensorRT-LLM are the ones used."""
    from trtllm_dflash.launch.dynamo import trtllm_version

    if subprocess.call(["python3", "-c", HAS_WORKER]) != 0:
        raise UserError("python3 -m dynamo.trtllm: not installed here; run this inside NVIDIA's Dynamo "
                        "tensorrtllm-runtime container, or pass --container IMAGE")
    here = subprocess.run(["python3", "-c", TRTLLM_VERSION], capture_output=True, text=True).stdout.strip()
    if here != trtllm_version(recipe):
        raise UserError(f"backend.trtllm_version {trtllm_version(recipe)}: this machine's TensorRT-LLM is "
                        f"{here or 'not installed'}; the worker would refuse the engine arguments written for it")


def _cluster(args, recipe, launch, endpoints) -> int:
    """Write the batch script or the DynamoGraphDeployment; print how to submit it (--run: submit)."""
    from trtllm_dflash.launch.cluster_job import ClusterOptions, make_job, storage_note
    from trtllm_dflash.launch.dynamo import image, write_file
    from trtllm_dflash.launch.dynamo_k8s import dgd_manifest
    from trtllm_dflash.launch.dynamo_slurm import dynamo_sbatch
    from trtllm_dflash.launch.node_command import served_paths

    if args.container:
        raise UserError(f"--container: docker run is for one node; --launcher {args.launcher} runs --image")
    endpoints = dataclasses.replace(endpoints, host=args.host or "0.0.0.0")
    job = make_job(recipe, "dynamo", [], endpoints, served_paths(args.from_dir))
    opts = ClusterOptions(image=args.image, registry=args.registry, partition=args.partition, account=args.account,
                          time=args.time, cpus_per_gpu=args.cpus_per_gpu, pvc=args.pvc)
    ref = image(recipe, args.image, args.registry)
    default = args.from_dir / "launch" / f"{job.name}{CLUSTER_SUFFIX[args.launcher]}"
    path = Path(args.out) if args.out is not None else default
    render = dynamo_sbatch if args.launcher == "srun" else dgd_manifest
    write_file(path, render(job, launch, opts, ref, path))
    submit = ["sbatch", str(path)] if args.launcher == "srun" else ["kubectl", "apply", "-f", str(path)]
    print(f"wrote {path}")
    print(f"submit: {shlex.join(submit)}")
    print(f"router: {launch.router_why}")
    print(f"shared storage: {storage_note(args.launcher, job, opts)}")
    if not args.execute:
        return 0
    if shutil.which(submit[0]) is None:
        raise UserError(f"{submit[0]}: not found on PATH; run `{shlex.join(submit)}` where the cluster's tools are")
    return subprocess.call(submit)
