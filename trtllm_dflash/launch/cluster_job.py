"""What one deployment launches on a cluster, whichever scheduler runs it: the Job (the recipe's
placement, the server command, the served paths) and serve's ClusterOptions, the command each
rank runs, the container image, what the containers mount and what that storage must provide.
slurm.py renders a Job as a batch script, kubernetes.py as a LeaderWorkerSet manifest.

trtllm-llmapi-launch (tensorrt_llm/llmapi/trtllm-llmapi-launch, main line, commit 020c89e6)
joins its arguments into one string and runs it unquoted: an argument with whitespace is split
into two (a later revision keeps them as an array; which releases carry which was not checked).
`rank_command` refuses such paths instead of launching a broken command.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.launch.llmapi_model import LLMAPIModel
from trtllm_dflash.launch.node_command import installed_first, leader_ranks_command
from trtllm_dflash.launch.server import Endpoints
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.containers import NVIDIA_REGISTRY, backend_image
from trtllm_dflash.recipe.plan.placement import Placement, placement
from trtllm_dflash.recipe.support import backend as backend_spec


@dataclass(frozen=True)
class ClusterOptions:
    """What the cluster needs beyond the recipe (serve's flags)."""

    image: str | None = None  # a full image reference; None: the backend's NVIDIA image on `registry`
    registry: str = NVIDIA_REGISTRY  # the registry holding NVIDIA's images, or a mirror of it
    partition: str | None = None  # Slurm; None: the cluster's default
    account: str | None = None  # Slurm; None: the user's default
    time: str | None = None  # Slurm; None: the partition's default limit
    cpus_per_gpu: int | None = None  # Slurm: CPUs per GPU a task drives; None: the cluster's default
    pvc: str | None = None  # Kubernetes: the claim holding the served directories (default <name>-runs)
    ssh_secret: str | None = None  # Kubernetes, several nodes: the ssh key pair (default <name>-mpi-ssh)


@dataclass(frozen=True)
class Job:
    """What one deployment launches, whichever scheduler runs it."""

    recipe: str  # the recipe's name
    name: str  # a DNS label from it (Kubernetes object names)
    backend: str
    api: str  # "triton", "openai" or "dynamo" (the pytorch backend behind Dynamo: launch/dynamo*.py)
    trtllm_version: str | None
    world: int  # tp x pp
    where: Placement
    server: list[str]  # the server command (tritonserver or trtllm-serve)
    endpoints: Endpoints
    paths: list[Path]  # what it reads, mounted where it is
    model_name: str = "dflash"  # the served model (engine ranks above 0 load only it)
    source: Path | None = None  # engine backend: the trtllm_dflash checkout the container installs
    llmapi: LLMAPIModel | None = None  # pytorch behind Triton: where TensorRT-LLM's model.py comes from and goes
    image: str | None = None  # the recipe's backend.image (None: the backend's default)


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
               recipe.world_size, where, list(server), endpoints, list(paths), recipe.serve.model_name, source, llmapi,
               recipe.backend.image)


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
    egg-info), the served directory holding the repository model.py is copied into, or
    trtllm-serve's per-request metrics and acceptance files (deploy/llmapi.py: under the deploy
    output's trtllm_serve/, which the sweep reads)."""
    from trtllm_dflash.deploy.repository import TRTLLM_SERVE

    if job.llmapi is not None:
        return [p for p in job.paths if p == job.llmapi.version_dir or p in job.llmapi.version_dir.parents][:1]
    if backend_spec(job.backend).static_schedule and job.api == "openai":
        return [job.paths[0] / TRTLLM_SERVE]
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
                        "lacks, and this trtllm_dflash is not a source checkout the job could install; pass --image, "
                        f"an image built FROM {backend_image(job.backend, 'triton', None)} with trtllm_dflash "
                        "installed")
    name = backend_image(job.backend, job.api, job.trtllm_version, job.image)
    if name is None:
        raise UserError(f"--image: no published Triton image carries TensorRT-LLM >= 1.3 (Triton's last TensorRT-LLM "
                        f"images, 26.04-26.07, carry 1.2.1); pass --image, an image with tritonserver and TensorRT-LLM "
                        f"{job.trtllm_version or '>= 1.3'} (docs/docker/triton-trtllm-llmapi.Dockerfile builds one), "
                        "or serve through trtllm-serve with --api openai")
    if not opts.registry.strip("/"):
        raise UserError(f"--registry: empty; {name} is on NVIDIA's registry: leave --registry out (nvcr.io), "
                        "name a mirror of it, or pass --image IMAGE")
    return f"{opts.registry.rstrip('/')}/{name}"


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
    return (f"the claim {opts.pvc or job.name + '-runs'!r} must hold {claim_root(job, opts)} as it is here, on storage "
            f"every node sees, bound {mode}" + (" (the pods write there)" if writes else ""))


def mount_root(paths: list[Path]) -> Path:
    """The one directory the pods mount from the claim: the deepest common parent of what the
    deployment reads (it must hold them at the same paths as here)."""
    root = Path(os.path.commonpath([str(p) for p in paths]))
    if root == Path(root.anchor):
        listed = ", ".join(str(p) for p in paths)
        raise UserError(f"{listed}: no common parent directory below {root}; one volume mounted at their common parent "
                        "must hold them: deploy (and convert/quantize/build) under one directory")
    return root


def claim_root(job: Job, opts: ClusterOptions) -> Path:
    """The directory the pods mount from the claim: what the job reads and the checkout it installs."""
    source = installing(job, opts)
    return mount_root([*job.paths, *([source] if source else [])])

