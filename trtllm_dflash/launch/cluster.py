"""Cluster launchers for a GPU deployment: a Slurm batch script (Pyxis/enroot containers) and a
Kubernetes LeaderWorkerSet manifest, both around the server command one node would run.

`serve --launcher srun` and `serve --launcher k8s` write them (default: DEPLOY_DIR/launch/);
nodes, processes and GPUs per node come from recipe/plan/placement.py, the images from
recipe/containers.py. `parallel.replicas` copies of the model are launched side by side: one
sbatch job of every copy's nodes with one srun step per copy (each its own endpoint, printed by
the job), or LWS `spec.replicas` groups behind the one Service. Both mount the deployment's
directories where they are, so they must be on storage every node sees: both say so, and the
batch script tests it on every node before any server starts.

The Job both render, and what they share (image, mounts, storage), is in cluster_job.py; the
batch script in slurm.py, the manifest in kubernetes.py, each with the upstream facts it follows.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.launch.cluster_job import ClusterOptions, Job
from trtllm_dflash.launch.kubernetes import lws_manifest
from trtllm_dflash.launch.slurm import sbatch_script

LAUNCH_DIR = "launch"  # under the deploy output


def write_launcher(kind: str, job: Job, opts: ClusterOptions, out: Path | None, deploy_dir: Path) -> tuple[Path, str]:
    """Write the sbatch script (kind "srun") or the manifest ("k8s") to `out` (default: under
    DEPLOY_DIR/launch/); return its path and the command that submits it."""
    suffix = ".sbatch" if kind == "srun" else "-lws.yaml"
    path = Path(out) if out is not None else Path(deploy_dir) / LAUNCH_DIR / f"{job.name}{suffix}"
    if path.is_dir():
        raise UserError(f"--out {path}: is a directory; give a file path")
    text = sbatch_script(job, opts, path) if kind == "srun" else lws_manifest(job, opts, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
    submit = ["sbatch", str(path)] if kind == "srun" else ["kubectl", "apply", "-f", str(path)]
    return path, shlex.join(submit)
