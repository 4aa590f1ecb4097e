"""The Slurm launcher: a batch script (Pyxis/enroot containers) that runs a Job's server command
as one srun step per model copy, after checking that every node sees the mounted directories.

Upstream facts it follows (read, not copied): Slurm (sbatch and srun manual pages; Pyxis wiki
"Usage"): `#SBATCH --nodes/--ntasks-per-node/--gpus-per-node/--exclusive/--partition/--account/
--time`; Pyxis adds `--container-image` (an enroot URI, `[USER@][REGISTRY#]IMAGE[:TAG]`: the
registry is separated by `#`), `--container-mounts=SRC:DST[:FLAGS],...` and `--container-workdir`
to srun. TensorRT-LLM's examples/llm-api/llm_mgmn_trtllm_serve.sh runs every rank as
`srun --mpi=pmix ... trtllm-llmapi-launch <server>`. `--gpu-bind=none`: every rank must see all
GPUs of its node, because TensorRT-LLM picks GPU `global_rank % device_count`
(recipe/plan/placement.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.launch.cluster_job import (
    ClusterOptions,
    Job,
    image_reference,
    installs_source,
    mounted,
    prepared,
    rank_command,
    storage_note,
    writable,
)


def enroot_uri(reference: str) -> str:
    """A registry reference as Pyxis/enroot takes it: `REGISTRY#IMAGE[:TAG]` when the first path
    component names a registry host (has a '.' or a ':', or is localhost: Docker's rule)."""
    if "#" in reference:
        return reference
    head, sep, rest = reference.partition("/")
    if sep and ("." in head or ":" in head or head == "localhost"):
        return f"{head}#{rest}"
    return reference



def cpus_per_task(job: Job, opts: ClusterOptions) -> list[str]:
    """`--cpus-per-task` for the job and for each step that runs ranks, where a copy shares its
    node: --cpus-per-gpu's CPUs for every GPU a task drives (the engine's one task per node: all
    of the node's). A step repeats it: Slurm 22.05's srun stopped inheriting the job's
    --cpus-per-task (sbatch(1), its NOTE), and a command-line value wins over the environment on
    every release. A copy on whole nodes (--exclusive) has every CPU of them, which srun's -c
    (it implies --exact) would only cut down: nothing. None given: the cluster's default."""
    if opts.cpus_per_gpu is None or job.where.whole_nodes:
        return []
    w = job.where
    return [f"--cpus-per-task={opts.cpus_per_gpu * (w.gpus_per_node // w.tasks_per_node)}"]


def shared_node_note(job: Job, opts: ClusterOptions) -> list[str]:
    """The header's warning where a copy shares its node and no CPU count was asked for."""
    if job.where.whole_nodes or opts.cpus_per_gpu is not None:
        return []
    return ["CPUs: this copy shares its node (no --exclusive), so each task gets the cluster's default CPUs (one "
            "unless DefCpuPerGPU or the partition says more); serve --cpus-per-gpu N asks for N per GPU."]


def sbatch_directives(job: Job, opts: ClusterOptions) -> list[str]:
    """The `#SBATCH` lines: the nodes of every model copy (each copy on nodes of its own), one task
    per rank (engine: one process), the GPUs, --exclusive when a copy takes whole nodes (its ranks
    own the node's GPUs and NVLink; a smaller one shares its node), and the user's partition,
    account and time limit when given (else the cluster's defaults apply)."""
    w = job.where
    lines = [f"--job-name=dflash-{job.recipe}", f"--nodes={w.replicas * w.nodes}",
             f"--ntasks-per-node={w.tasks_per_node}", f"--gpus-per-node={w.gpus_per_node}",
             *(["--exclusive"] if w.whole_nodes else []), *cpus_per_task(job, opts), "--output=%x-%j.out"]
    lines += [f"--{flag}={value}" for flag, value in
              (("partition", opts.partition), ("account", opts.account), ("time", opts.time)) if value]
    return [f"#SBATCH {line}" for line in lines]


def container_mounts(paths: list[Path], writes: list[Path]) -> str:
    """Pyxis `--container-mounts`: every served path at its own place (the repository names them
    by absolute path), read-only unless the job writes it (`writes`, read-write)."""
    everything = list(dict.fromkeys([*paths, *writes]))
    bad = next((p for p in everything if "," in str(p) or ":" in str(p)), None)
    if bad is not None:
        raise UserError(f"{bad}: Pyxis separates --container-mounts with ',' and ':'; move it to a path without them")
    return ",".join(f"{p}:{p}" if p in writes else f"{p}:{p}:ro" for p in everything)


def srun_command(job: Job, opts: ClusterOptions) -> list[str]:
    """The job step: every task in the container, the ranks one PMIx world (several ranks)."""
    cmd = ["srun", f"--container-image={enroot_uri(image_reference(job, opts, slurm=True))}",
           f"--container-mounts={container_mounts(job.paths, writable(job, opts))}",
           f"--container-workdir={job.paths[0]}"]
    # Pyxis starts containers read-only unless the cluster made them writable (ENROOT_ROOTFS_WRITABLE):
    # installing the checkout into the image's environment needs a writable root, owned by us.
    if installs_source(job, opts):
        cmd += ["--container-writable", "--container-remap-root"]
    # One task needs no PMI from Slurm (the engine's mpirun makes its own world); several form one.
    cmd += ["--mpi=pmix" if job.where.tasks > 1 else "--mpi=none", *cpus_per_task(job, opts), "--gpu-bind=none"]
    return [*cmd, *prepared(job, opts, rank_command(job, slurm=True))]


def _sbatch_header(job: Job, opts: ClusterOptions, path: Path) -> list[str]:
    w, e = job.where, job.endpoints
    unset = [f for f, v in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)) if not v]
    lines = [
        f"Generated by `trtllm-dflash serve --launcher srun` from recipe {job.recipe!r} ({job.backend} backend, "
        f"--api {job.api}).",
        f"{w.replicas} model copy(ies) (parallel.replicas), each on {w.nodes} node(s) of its own x {w.tasks_per_node} "
        f"task(s), {w.gpus_per_node} GPU(s) per node; every task sees all GPUs of its node (--gpu-bind=none): "
        "TensorRT-LLM picks GPU global_rank % device_count.",
    ]
    if w.replicas > 1:
        lines.append(f"Every copy serves on its first node (HTTP port {e.http_port}); the job prints each endpoint. "
                     "One endpoint in front: point `trtllm-dflash sweep --url` at each, or put any HTTP load balancer "
                     "(nginx, HAProxy, a Kubernetes Service) over the printed HOST:PORT list.")
    lines.append(f"Shared storage: {storage_note('srun', job, opts)}.")
    lines += shared_node_note(job, opts)
    if unset:
        lines.append(f"{', '.join(unset)}: the cluster's default (serve --{' / --'.join(unset)} sets it).")
    lines.append(f"Submit: sbatch {shlex.quote(str(path))}")
    return ["#!/bin/bash", *(f"# {line}" for line in lines), *sbatch_directives(job, opts)]


def storage_check(job: Job, opts: ClusterOptions) -> list[str]:
    """Shell: one task on every node of the job (outside the container) tests that each mounted
    directory is there, before any server starts; the job stops naming the node that lacks one."""
    paths = " ".join(shlex.quote(str(p)) for p in mounted(job, opts))
    test = (f'for p in {paths}; do [ -d "$p" ] || {{ echo "trtllm-dflash: $(hostname) does not see $p: every '
            'path the job mounts must be on storage every node sees (a shared filesystem)" >&2; exit 1; }; done')
    return ["# Every node sees every mounted directory (shared storage), or nothing starts.",
            f'srun --nodes="${{#hosts[@]}}" --ntasks-per-node=1 bash -c {shlex.quote(test)} || exit 1']


def sbatch_script(job: Job, opts: ClusterOptions, path: Path) -> str:
    """The whole batch script, to be submitted with `sbatch PATH`: one srun step per model copy,
    on nodes of its own (`--nodelist`: the job's nodes in order, `nodes` per copy), in the
    background; the job ends with the last copy and fails when any did."""
    w, e = job.where, job.endpoints
    step = srun_command(job, opts)
    n = 1 + next(i for i, a in enumerate(step[1:]) if not a.startswith("--"))
    flags, command = step[1:n], step[n:]
    srun = ["srun", f"--nodes={w.nodes}", f"--ntasks-per-node={w.tasks_per_node}", '--nodelist="$nodes"',
            *(shlex.quote(f) for f in flags), shlex.join(command)]
    body = [
        "",
        "set -euo pipefail",
        'mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        *storage_check(job, opts),
        "",
        f"serve_copy() {{  # serve_copy I: model copy I on job nodes I*{w.nodes} .. I*{w.nodes}+{w.nodes - 1}",
        f"  local first=$(( $1 * {w.nodes} )) nodes",
        f'  nodes=$(IFS=,; echo "${{hosts[*]:first:{w.nodes}}}")',
        f'  echo "trtllm-dflash: copy $1 (rank 0 on ${{hosts[first]}}) serves http://${{hosts[first]}}:{e.http_port}"',
        "  " + " \\\n      ".join(srun),
        "}",
        "",
        "pids=()",
        f'for i in $(seq 0 {w.replicas - 1}); do serve_copy "$i" & pids+=("$!"); done',
        'status=0; for pid in "${pids[@]}"; do wait "$pid" || status=$?; done',
        'exit "$status"',
    ]
    return "\n".join(_sbatch_header(job, opts, path) + body) + "\n"
