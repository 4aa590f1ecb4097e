"""Cluster launchers for a GPU deployment: a Slurm batch script (Pyxis/enroot containers) and a
Kubernetes LeaderWorkerSet manifest, both around the server command one node would run.

`serve --launcher srun` and `serve --launcher k8s` write them (default: DEPLOY_DIR/launch/);
nodes, processes and GPUs per node come from recipe/placement.py, the images from
recipe/containers.py. `parallel.replicas` copies of the model are launched side by side: one
sbatch job of every copy's nodes with one srun step per copy (each its own endpoint, printed by
the job), or LWS `spec.replicas` groups behind the one Service. Both mount the deployment's
directories where they are, so they must be on storage every node sees: both say so, and the
batch script tests it on every node before any server starts. Upstream facts they follow
(read, not copied):

Slurm (sbatch and srun manual pages; Pyxis wiki "Usage"): `#SBATCH --nodes/--ntasks-per-node/
--gpus-per-node/--exclusive/--partition/--account/--time`; Pyxis adds `--container-image`
(an enroot URI, `[USER@][REGISTRY#]IMAGE[:TAG]`: the registry is separated by `#`),
`--container-mounts=SRC:DST[:FLAGS],...` and `--container-workdir` to srun. TensorRT-LLM's
examples/llm-api/llm_mgmn_trtllm_serve.sh runs every rank as `srun --mpi=pmix ...
trtllm-llmapi-launch <server>`. `--gpu-bind=none`: every rank must see all GPUs of its node,
because TensorRT-LLM picks GPU `global_rank % device_count` (recipe/placement.py).

trtllm-llmapi-launch (tensorrt_llm/llmapi/trtllm-llmapi-launch, main line, commit 020c89e6)
joins its arguments into one string and runs it unquoted: an argument with whitespace is split
into two (a later revision keeps them as an array; which releases carry which was not checked).
`rank_command` refuses such paths instead of launching a broken command.

Kubernetes (LeaderWorkerSet API leaderworkerset.x-k8s.io/v1, kubernetes-sigs/lws
api/leaderworkerset/v1/leaderworkerset_types.go at 024af084, pkg/utils/pod/pod_utils.go
`AddLWSVariables` at 1b17603c): a group is one leader pod `<name>-<group>` and workers `<name>-<group>-<i>`
sharing the leader's DNS subdomain; LWS injects LWS_LEADER_ADDRESS (`<name>-<group>.<subdomain>.
<namespace>`), LWS_GROUP_SIZE and LWS_WORKER_INDEX (0 on the leader) and labels every pod with
`leaderworkerset.sigs.k8s.io/name` and `.../worker-index`. It creates a headless Service named
like the set, so ours is `<name>-api`. TensorRT-LLM's ranks form one MPI world started from the
leader: the leader runs `mpirun` over ssh into the workers, which run sshd (the pattern of NVIDIA
Dynamo's operator, deploy/cloud/operator/internal/dynamo/backend_trtllm.go at 02b3bad0: port 2222, a key
pair from a Secret, OMPI_MCA_orte_keep_fqdn_hostnames=1 so remote daemons get resolvable
names). Pods of a group start together (startupPolicy LeaderCreated: LeaderReady would wait for
a leader that waits for its workers), and a group restarts as a whole
(RecreateGroupOnPodRestart): an MPI world does not survive a lost rank.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from trtllm_dflash.errors import UserError
from trtllm_dflash.launch.llmapi_model import LLMAPIModel
from trtllm_dflash.launch.server import Endpoints, installed_first, leader_ranks_command, mpi_world
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.containers import NVIDIA_REGISTRY, backend_image
from trtllm_dflash.recipe.placement import Placement, placement
from trtllm_dflash.recipe.support import backend as backend_spec

LAUNCH_DIR = "launch"  # under the deploy output
SSH_PORT = 2222  # unprivileged: the worker's sshd needs no root to bind it
SSH_KEYS = "/etc/trtllm-dflash/mpi-ssh"  # the Secret's mount: id_ed25519, id_ed25519.pub
STORAGE_ANNOTATION = "trtllm-dflash/shared-storage"  # on the LeaderWorkerSet: what its claim must be
READY_PATH = {"triton": "/v2/health/ready", "openai": "/health"}  # Triton's and trtllm-serve's readiness


@dataclass(frozen=True)
class ClusterOptions:
    """What the cluster needs beyond the recipe (serve's flags)."""

    image: str | None = None  # a full image reference; None: the backend's NVIDIA image on `registry`
    registry: str = NVIDIA_REGISTRY  # the registry holding NVIDIA's images, or a mirror of it
    partition: str | None = None  # Slurm; None: the cluster's default
    account: str | None = None  # Slurm; None: the user's default
    time: str | None = None  # Slurm; None: the partition's default limit
    pvc: str | None = None  # Kubernetes: the claim holding the served directories (default <name>-runs)
    ssh_secret: str | None = None  # Kubernetes, several nodes: the ssh key pair (default <name>-mpi-ssh)


@dataclass(frozen=True)
class Job:
    """What one deployment launches, whichever scheduler runs it."""

    recipe: str  # the recipe's name
    name: str  # a DNS label from it (Kubernetes object names)
    backend: str
    api: str  # "triton" or "openai"
    trtllm_version: str | None
    world: int  # tp x pp
    where: Placement
    server: list[str]  # the server command (tritonserver or trtllm-serve)
    endpoints: Endpoints
    paths: list[Path]  # what it reads, mounted where it is
    model_name: str = "dflash"  # the served model (engine ranks above 0 load only it)
    source: Path | None = None  # engine backend: the trtllm_dflash checkout the container installs
    llmapi: LLMAPIModel | None = None  # pytorch behind Triton: where TensorRT-LLM's model.py comes from and goes


def dns_label(text: str) -> str:
    """A Kubernetes object name (DNS-1035 label) from a recipe name: lowercase letters, digits and
    '-', starting with a letter; short enough for the pod names LWS derives from it."""
    label = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not label[:1].isalpha():
        label = f"dflash-{label}"
    return label[:40].rstrip("-")


def source_checkout() -> Path | None:
    """The source checkout this trtllm_dflash runs from (an editable install), None otherwise."""
    import trtllm_dflash

    root = Path(trtllm_dflash.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "setup.py").is_file() else None


def make_job(recipe: Recipe, api: str, server: list[str], endpoints: Endpoints, paths: list[Path],
             llmapi: LLMAPIModel | None = None) -> Job:
    """The job for `recipe`, every one of its `parallel.replicas` model copies (a one-line
    UserError for a recipe no cluster launcher expresses)."""
    where = placement(recipe)
    source = checkout_to_install(recipe.backend.name)
    return Job(recipe.name, dns_label(recipe.name), recipe.backend.name, api, recipe.backend.trtllm_version,
               recipe.world_size, where, list(server), endpoints, list(paths), recipe.serve.model_name, source, llmapi)


def checkout_to_install(backend: str) -> Path | None:
    """The source checkout a container of `backend` installs (its Triton model imports
    trtllm_dflash), None when it needs none or this trtllm_dflash is not a checkout."""
    return source_checkout() if _ours_in_container(backend) else None


def _ours_in_container(backend: str) -> bool:
    """The backend's Triton model is ours (it imports trtllm_dflash) and runs in NVIDIA's image."""
    spec = backend_spec(backend)
    return spec.needs_gpu and spec.triton_model == "dflash"


def rank_command(job: Job, slurm: bool) -> list[str]:
    """What one process runs. pytorch: the server, under trtllm-llmapi-launch when the world has
    several ranks (rank 0 serves, the others join as workers); engine: one mpirun of one
    tritonserver per rank (leader mode)."""
    if not backend_spec(job.backend).spans_nodes:  # one node: an mpirun of leader-mode tritonservers
        return leader_ranks_command(job.server, job.world, job.model_name, oversubscribe=slurm)
    if job.world == 1:
        return job.server
    spaced = next((a for a in job.server if any(c.isspace() for c in a)), None)
    if spaced is not None:
        raise UserError(f"{spaced!r}: trtllm-llmapi-launch splits its command at whitespace "
                        "(tensorrt_llm/llmapi/trtllm-llmapi-launch); move the deployment to a path without spaces")
    return ["trtllm-llmapi-launch", *job.server]


def prepared(job: Job, opts: ClusterOptions, cmd: list[str]) -> list[str]:
    """`cmd` after what the container needs first: this checkout installed (engine backend on
    NVIDIA's image), or TensorRT-LLM's model.py copied into the repository (pytorch behind Triton;
    several ranks: refused when that model.py clears the MPI environment)."""
    if job.llmapi is not None:
        return job.llmapi.wrapped(cmd, multi_rank=job.world > 1)
    return installed_first(cmd, installing(job, opts))


def writable(job: Job, opts: ClusterOptions) -> list[Path]:
    """The mounted directories the job writes: the source checkout it installs (pip writes its
    egg-info) or the served directory holding the repository model.py is copied into."""
    if job.llmapi is not None:
        return [p for p in job.paths if p == job.llmapi.version_dir or p in job.llmapi.version_dir.parents][:1]
    source = installing(job, opts)
    return [source] if source else []


def installs_source(job: Job, opts: ClusterOptions) -> bool:
    """The engine backend's Triton model imports trtllm_dflash, which NVIDIA's image lacks: a job
    on NVIDIA's image (no --image) installs it from this source checkout, mounted where it is
    (the shared file system of a Slurm cluster, the claim of a Kubernetes one), with no network:
    launch.install_command."""
    return _ours_in_container(job.backend) and not opts.image and job.source is not None


def installing(job: Job, opts: ClusterOptions) -> Path | None:
    """The source checkout the job installs, or None."""
    return job.source if installs_source(job, opts) else None


def image_reference(job: Job, opts: ClusterOptions, slurm: bool) -> str:
    """The image as a registry reference (`REGISTRY/NAME:TAG`): --image, else the backend's NVIDIA
    image on --registry (default nvcr.io, NVIDIA's registry: the images are not on Docker Hub)."""
    if opts.image:
        return opts.image
    if _ours_in_container(job.backend) and job.source is None:
        raise UserError("--image: the engine backend's Triton model imports trtllm_dflash, which NVIDIA's image "
                        "lacks, and this trtllm_dflash is not a source checkout the job could install; pass --image, an "
                        f"image built FROM {backend_image(job.backend, 'triton', None)} with trtllm_dflash installed")
    name = backend_image(job.backend, job.api, job.trtllm_version)
    if name is None:
        raise UserError(f"--image: no published Triton image carries TensorRT-LLM >= 1.3 (Triton 25.12-26.07 carry "
                        f"1.2.1); pass --image, an image with tritonserver and TensorRT-LLM "
                        f"{job.trtllm_version or '>= 1.3'} (docs/docker/triton-trtllm-llmapi.Dockerfile builds one), or serve through trtllm-serve "
                        "with --api openai")
    if not opts.registry.strip("/"):
        raise UserError(f"--registry: empty; {name} is on NVIDIA's registry: leave --registry out (nvcr.io), "
                        "name a mirror of it, or pass --image IMAGE")
    return f"{opts.registry.rstrip('/')}/{name}"


def enroot_uri(reference: str) -> str:
    """A registry reference as Pyxis/enroot takes it: `REGISTRY#IMAGE[:TAG]` when the first path
    component names a registry host (has a '.' or a ':', or is localhost: Docker's rule)."""
    if "#" in reference:
        return reference
    head, sep, rest = reference.partition("/")
    if sep and ("." in head or ":" in head or head == "localhost"):
        return f"{head}#{rest}"
    return reference


def mounted(job: Job, opts: ClusterOptions) -> list[Path]:
    """Every host directory the job's containers mount, where it is."""
    return list(dict.fromkeys([*job.paths, *writable(job, opts)]))


def storage_note(kind: str, job: Job, opts: ClusterOptions) -> str:
    """What the cluster's storage must provide, one sentence (the script header, the manifest's
    comment and annotation, and serve's message say it): the nodes mount these paths where they
    are here, so they must be on storage every node sees."""
    if kind == "srun":
        return (f"every path the job mounts ({', '.join(map(str, mounted(job, opts)))}) must be on storage every node "
                "sees (a shared filesystem, at the same path); the job checks it on every node before starting")
    w, writes = job.where, bool(writable(job, opts))
    if w.nodes > 1 or w.replicas > 1:  # pods on several nodes mount the claim at once
        mode = "ReadWriteMany" if writes else "ReadOnlyMany or ReadWriteMany"
    else:
        mode = "ReadWriteOnce or ReadWriteMany" if writes else "any access mode"
    return (f"the claim {opts.pvc or job.name + '-runs'!r} must hold {_claim_root(job, opts)} as it is here, on storage "
            f"every node sees, bound {mode}" + (" (the pods write there)" if writes else ""))


# ----------------------------------------------------------------------------- Slurm


def sbatch_directives(job: Job, opts: ClusterOptions) -> list[str]:
    """The `#SBATCH` lines: the nodes of every model copy (each copy on nodes of its own), one task
    per rank (engine: one process), the GPUs, --exclusive when a copy takes whole nodes (its ranks
    own the node's GPUs and NVLink; a smaller one shares its node), and the user's partition,
    account and time limit when given (else the cluster's defaults apply)."""
    w = job.where
    lines = [f"--job-name=dflash-{job.recipe}", f"--nodes={w.replicas * w.nodes}",
             f"--ntasks-per-node={w.tasks_per_node}", f"--gpus-per-node={w.gpus_per_node}",
             *(["--exclusive"] if w.whole_nodes else []), "--output=%x-%j.out"]
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
    # One task needs no PMI from Slurm (the engine's mpirun makes its own world); several form one.
    cmd += ["--mpi=pmix" if job.where.tasks > 1 else "--mpi=none", "--gpu-bind=none"]
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
    if unset:
        lines.append(f"{', '.join(unset)}: the cluster's default (serve --{' / --'.join(unset)} sets it).")
    lines.append(f"Submit: sbatch {shlex.quote(str(path))}")
    return ["#!/bin/bash", *(f"# {line}" for line in lines), *sbatch_directives(job, opts)]


def _storage_check(job: Job, opts: ClusterOptions) -> list[str]:
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
        *_storage_check(job, opts),
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


# ----------------------------------------------------------------------------- Kubernetes


def mount_root(paths: list[Path]) -> Path:
    """The one directory the pods mount from the claim: the deepest common parent of what the
    deployment reads (it must hold them at the same paths as here)."""
    root = Path(os.path.commonpath([str(p) for p in paths]))
    if root == Path(root.anchor):
        listed = ", ".join(str(p) for p in paths)
        raise UserError(f"{listed}: no common parent directory below {root}; one volume mounted at their common parent "
                        "must hold them: deploy (and convert/quantize/build) under one directory")
    return root


def _claim_root(job: Job, opts: ClusterOptions) -> Path:
    source = installing(job, opts)
    return mount_root([*job.paths, *([source] if source else [])])


def _ports(job: Job) -> list[dict]:
    e = job.endpoints
    named = [("http", e.http_port)]
    if job.api == "triton":
        named += [("grpc", e.grpc_port), ("metrics", e.metrics_port)]
    return [{"name": name, "containerPort": port} for name, port in named]


def leader_command(job: Job, opts: ClusterOptions) -> list[str]:
    """The leader's process, after what the container needs first (`prepared`). One node: the
    rank command, the ranks under a local mpirun. Several: wait for every worker's sshd (the pods
    start together, not in order), then one mpirun over ssh places `gpus_per_node` ranks on each
    pod, filling the leader first (rank 0, the server, stays where the Service and the readiness
    probe look)."""
    rank = rank_command(job, slurm=False)
    if not backend_spec(job.backend).spans_nodes or job.world == 1:
        return prepared(job, opts, rank)
    if job.where.nodes == 1:
        return prepared(job, opts, mpi_world(job.world, rank))
    w, key = job.where, "$HOME/.ssh/id_ed25519"
    ssh = f"-p {SSH_PORT} -i {key} -o BatchMode=yes -o StrictHostKeyChecking=no"
    # mpirun by absolute path: Open MPI then starts its remote daemons from the same prefix (ssh
    # sessions do not get the image's PATH). --bind-to none: TensorRT-LLM sets each rank's CPU
    # affinity itself (base_worker.py configure_cpu_affinity).
    mpirun = ['"$(command -v mpirun)"', "--allow-run-as-root", "-np", str(job.world), "--map-by", "slot",
              "--bind-to", "none"]
    script = [
        "set -eu",
        *(job.llmapi.prelude(multi_rank=True) if job.llmapi else []),
        'mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh"',
        f'install -m 600 {SSH_KEYS}/id_ed25519 "{key}"',
        'group="${LWS_LEADER_ADDRESS%%.*}"; domain="${LWS_LEADER_ADDRESS#*.}"',
        f'hosts="$LWS_LEADER_ADDRESS:{w.gpus_per_node}"',
        'for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do',
        '  worker="$group-$i.$domain"',
        f'  until ssh {ssh} "$worker" true 2>/dev/null; do echo "waiting for $worker"; sleep 5; done',
        f'  hosts="$hosts,$worker:{w.gpus_per_node}"',
        "done",
        " ".join(["exec", *mpirun, '-H "$hosts"', "--mca", "plm_rsh_args", f'"{ssh}"', "-x", "PATH",
                  "-x", "LD_LIBRARY_PATH", shlex.join(rank)]),
    ]
    return ["/bin/bash", "-c", "\n".join(script)]


def worker_command() -> list[str]:
    """A worker pod's process: sshd on SSH_PORT accepting the Secret's key, in the foreground; the
    leader's mpirun starts this pod's ranks through it."""
    script = [
        "set -eu",
        'sshd="$(command -v sshd || echo /usr/sbin/sshd)"',
        '[ -x "$sshd" ] || { echo "trtllm-dflash: this image has no sshd (openssh-server); the workers of a '
        'multi-node group need it: the leader starts their ranks over ssh" >&2; exit 1; }',
        'mkdir -p "$HOME/.ssh" /run/sshd && chmod 700 "$HOME/.ssh"',
        f'install -m 600 {SSH_KEYS}/id_ed25519.pub "$HOME/.ssh/authorized_keys"',
        'rm -f "$HOME/.ssh/host_ed25519" && ssh-keygen -q -t ed25519 -N "" -f "$HOME/.ssh/host_ed25519"',
        f'exec "$sshd" -D -e -p {SSH_PORT} -h "$HOME/.ssh/host_ed25519" -o PasswordAuthentication=no '
        "-o PermitRootLogin=prohibit-password -o AuthorizedKeysFile=.ssh/authorized_keys",
    ]
    return ["/bin/bash", "-c", "\n".join(script)]


def _volumes(job: Job, opts: ClusterOptions) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): shared memory for NCCL and MPI (a container's default /dev/shm is 64 MB),
    the claim holding the served directories at their paths (read-write when the job writes
    there: `writable`), and the ssh keys across nodes."""
    read_only, root = not writable(job, opts), _claim_root(job, opts)
    claim = {"claimName": opts.pvc or f"{job.name}-runs", "readOnly": read_only}
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "runs", "persistentVolumeClaim": claim}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "runs", "mountPath": str(root), "readOnly": read_only}]
    if job.where.nodes > 1:
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": opts.ssh_secret or f"{job.name}-mpi-ssh",
                                                      "defaultMode": 0o400}})
        mounts.append({"name": "mpi-ssh", "mountPath": SSH_KEYS, "readOnly": True})
    return volumes, mounts


def pod_template(job: Job, opts: ClusterOptions, leader: bool) -> dict:
    """A pod of the group: the leader runs the server (ports, readiness on its health endpoint),
    a worker runs sshd; both hold a node's GPUs, shared memory and the served directories."""
    volumes, mounts = _volumes(job, opts)
    container = {
        "name": "server" if leader else "worker",
        "image": image_reference(job, opts, slurm=False),
        "command": leader_command(job, opts) if leader else worker_command(),
        "resources": {"limits": {"nvidia.com/gpu": job.where.gpus_per_node}},
        "volumeMounts": mounts,
    }
    if job.where.nodes > 1:
        container["env"] = [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"}]
    if leader:
        container["ports"] = _ports(job)
        # One health endpoint, three probes. The startup probe gives loading up to 30 minutes
        # before liveness counts (a failing liveness probe restarts the whole group,
        # RecreateGroupOnPodRestart). Liveness then restarts a group whose rank died: the server
        # stays up but unloads its model (triton_model.mark_unavailable), which nothing else mends.
        probe = {"httpGet": {"path": READY_PATH[job.api], "port": "http"}, "periodSeconds": 10}
        container["startupProbe"] = {**probe, "failureThreshold": 180}
        container["readinessProbe"] = {**probe, "failureThreshold": 3}
        container["livenessProbe"] = {**probe, "failureThreshold": 6}
    labels = {"app.kubernetes.io/name": "trtllm-dflash", "app.kubernetes.io/instance": job.name,
              "role": "leader" if leader else "worker"}
    return {"metadata": {"labels": labels}, "spec": {"containers": [container], "volumes": volumes}}


def leader_worker_set(job: Job, opts: ClusterOptions) -> dict:
    """One group of `nodes` pods per model copy (`spec.replicas`: parallel.replicas); with one node
    the leader is the whole group (LWS requires a workerTemplate and uses it for the leader when
    no leaderTemplate is given)."""
    template: dict = {"size": job.where.nodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    if job.where.nodes > 1:
        template["leaderTemplate"] = pod_template(job, opts, leader=True)
        template["workerTemplate"] = pod_template(job, opts, leader=False)
    else:
        template["workerTemplate"] = pod_template(job, opts, leader=True)
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": job.name, "labels": {"app.kubernetes.io/name": "trtllm-dflash"},
                     "annotations": {STORAGE_ANNOTATION: storage_note("k8s", job, opts)}},
        "spec": {"replicas": job.where.replicas, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template},
    }


def leader_service(job: Job) -> dict:
    """The leader's ports: LWS's own labels pick the leader (worker index 0) of every group of this
    set, so with replicas the Service spreads connections over the copies."""
    ports = [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]} for p in _ports(job)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{job.name}-api", "labels": {"app.kubernetes.io/name": "trtllm-dflash"}},
        "spec": {"selector": {"leaderworkerset.sigs.k8s.io/name": job.name,
                              "leaderworkerset.sigs.k8s.io/worker-index": "0"},
                 "ports": ports},
    }


def lws_manifest(job: Job, opts: ClusterOptions, path: Path) -> str:
    """The LeaderWorkerSet and its Service as one multi-document YAML, for `kubectl apply -f PATH`."""
    w = job.where
    head = [f"Generated by `trtllm-dflash serve --launcher k8s` from recipe {job.recipe!r} ({job.backend} backend, "
            f"--api {job.api}).",
            f"{w.replicas} group(s) (parallel.replicas), each one model copy of {w.nodes} pod(s) x {w.gpus_per_node} "
            "GPU(s); needs the LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1).",
            f"The Service {job.name}-api is the one endpoint: it spreads connections over every group's leader.",
            f"Shared storage: {storage_note('k8s', job, opts)}.",
            f"Apply: kubectl apply -f {shlex.quote(str(path))}"]
    if w.nodes > 1:
        secret = opts.ssh_secret or f"{job.name}-mpi-ssh"
        head.append(f"First: ssh-keygen -t ed25519 -N '' -f key && kubectl create secret generic {secret} "
                    "--from-file=id_ed25519=key --from-file=id_ed25519.pub=key.pub (the image needs sshd on workers)")
    docs = yaml.dump_all([leader_worker_set(job, opts), leader_service(job)], Dumper=_BlockScripts, sort_keys=False)
    return "".join(f"# {line}\n" for line in head) + docs


class _BlockScripts(yaml.SafeDumper):
    """Multi-line strings (the pods' shell scripts) as YAML literal blocks, readable as written."""


_BlockScripts.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


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
