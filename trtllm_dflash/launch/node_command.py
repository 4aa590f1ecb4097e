"""The launch command of a deployment on one GPU node, inside NVIDIA's Triton + TensorRT-LLM
container: tritonserver's command line (`server_command`), the engine backend's one tritonserver
per rank under mpirun (`leader_ranks_command`), the pytorch backend's forms (`launch_command`),
the directories a deployment opens (`served_paths`) and the `docker run` around it
(`in_container`). launch/cluster.py writes the Slurm and Kubernetes launchers across nodes around
the same server command; launch/server.py runs the CPU server itself.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trtllm_dflash.deploy.settings import PATHS
from trtllm_dflash.launch.server import Endpoints

TRITONSERVER = "/opt/tritonserver/bin/tritonserver"  # where NVIDIA's Triton images install it


def server_command(repository: Path, endpoints: Endpoints) -> list[str]:
    """tritonserver over `repository` bound to `endpoints`, auto-complete off (deploy writes every
    config field), inside NVIDIA's Triton + TensorRT-LLM container."""
    e = endpoints
    return [
        TRITONSERVER,
        f"--model-repository={repository}",
        f"--http-address={e.host}",
        f"--grpc-address={e.host}",
        f"--http-port={e.http_port}",
        f"--grpc-port={e.grpc_port}",
        f"--metrics-port={e.metrics_port}",
        "--disable-auto-complete-config",
    ]


def leader_ranks_command(server: list[str], world_size: int, model_name: str, oversubscribe: bool = False) -> list[str]:
    """The engine backend's launch: one tritonserver per rank under one mpirun on one node (an MPMD
    world), each with its own Python-backend shared-memory prefix, ranks above 0 loading only the
    model: the leader-mode form of triton_backend/scripts/launch_triton_server.py (`get_cmd`, read
    on the main line, commit 0a2e2c1f). Every rank's model opens the target Executor in leader
    mode (runtime/trt_runners.py parallel_config); rank 0 serves, the others run the target's shard
    and never finish loading, so they never bind the ports (docs/engine-tp.md: why leader mode,
    not orchestrator mode). Every rank runs under explicit model control: rank 0 loads every model
    and can mark its own unavailable when a rank dies (triton_model.mark_unavailable).
    `oversubscribe`: inside a one-task Slurm step mpirun sees one slot (that script's
    `--oversubscribe`, "mainly for SLURM MPI")."""

    def rank(i: int) -> list[str]:
        own = "--load-model=*" if i == 0 else f"--load-model={model_name}"
        return [*server, f"--backend-config=python,shm-region-prefix-name=prefix{i}_", "--model-control-mode=explicit",
                own]

    if world_size == 1:
        return rank(0)
    cmd = ["mpirun", "--allow-run-as-root", *(["--oversubscribe"] if oversubscribe else [])]
    for i in range(world_size):
        cmd += ["-n", "1", *rank(i)] + ([":"] if i < world_size - 1 else [])
    return cmd


def launch_command(repository: Path, endpoints: Endpoints, world_size: int, model_name: str, llmapi: bool,
                   launcher: str = "single_node") -> list[str]:
    """The launch command of tritonserver on one node inside NVIDIA's Triton + TensorRT-LLM container.

    Engine backend (our Triton model over TensorRT-LLM 1.2.x engines): `leader_ranks_command`,
    whatever the launcher.

    pytorch backend (TensorRT-LLM's LLM-API model): "single_node" runs a single tritonserver; its
    model creates LLM(...) with model.yaml's tensor_parallel_size, which spawns the MPI workers
    itself (the documented multi-GPU setup of triton_backend/all_models/llmapi). "mpirun" starts
    an MPI world of tp x pp ranks, every rank under trtllm-llmapi-launch: rank 0 runs
    tritonserver, the others run tensorrt_llm.llmapi.mgmn_worker_node
    (tensorrt_llm/llmapi/trtllm-llmapi-launch), and model.py hands COMM_WORLD to the LLM.
    Across nodes, launch/cluster.py writes the Slurm and Kubernetes launchers around the same
    server command.
    """
    server = server_command(repository, endpoints)
    if not llmapi:
        return leader_ranks_command(server, world_size, model_name)
    if launcher == "mpirun":
        return mpi_world(world_size, ["trtllm-llmapi-launch", *server])
    return server


def mpi_world(world_size: int, rank: list[str]) -> list[str]:
    """`rank` as every process of a world_size MPI world on this node."""
    return ["mpirun", "--allow-run-as-root", "-n", str(world_size), *rank]


def served_paths(deploy_dir: Path) -> list[Path]:
    """Every directory a deployment opens, resolved, as its own files name them: the deploy
    output, the stage output it serves (its manifest's input: the build on the engine backend)
    and each directory its dflash model's settings name (deploy/settings.py PATHS: the engines and
    the checkpoint beside them, whose tokenizer and manifest the model opens). Paths inside are
    relative to each other, so a container mounts each where it is and they still meet."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from trtllm_dflash.artifacts import Manifest
    from trtllm_dflash.deploy.settings import REPOSITORY, ModelSettings

    deploy_dir = Path(deploy_dir).resolve()
    m = Manifest.read(deploy_dir)
    paths = [deploy_dir] + ([m.input_dir(deploy_dir)] if m.input else [])
    config = deploy_dir / REPOSITORY / str(m.extra.get("model_name", "")) / "config.pbtxt"
    if config.is_file():
        cfg = text_format.Parse(config.read_text(), mc.ModelConfig())
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        settings = ModelSettings.from_params(params, str(config)).resolved(deploy_dir)
        paths += [Path(v) for k in PATHS if (v := getattr(settings, k))]
    return list(dict.fromkeys(paths))


def install_command(source: Path) -> list[str]:
    """Install this trtllm_dflash source checkout into NVIDIA's image, where the engine backend's
    Triton model imports it. Offline by construction: --no-index (pip reads no package index),
    --no-deps (the image's torch, transformers and the rest satisfy the requirements without
    moving its pins: docs/compat.md), --no-build-isolation (the image's setuptools builds it, none
    is fetched). Editable: pip writes only the checkout's egg-info, so the checkout is mounted
    read-write."""
    return ["python3", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation", "-e",
            str(source)]


def installed_first(cmd: list[str], source: Path | None) -> list[str]:
    """`cmd`, after installing `source` (install_command) when one is given."""
    if source is None:
        return cmd
    return ["bash", "-c", f"{shlex.join(install_command(source))} && exec {shlex.join(cmd)}"]


def in_container(cmd: list[str], image: str, paths: list[Path], source: Path | None = None) -> list[str]:
    """`cmd` inside the container `image` (NVIDIA's TensorRT-LLM or Triton + TensorRT-LLM image,
    the user's choice of tag): all GPUs, host IPC (NCCL, MPI shared memory), the host's network
    (the server binds the address it was given, loopback included), the paths the command reads
    mounted at the same place and, given a `source` checkout, that checkout installed first
    (install_command: the engine backend's model imports trtllm_dflash, NVIDIA's image lacks it)."""
    run = ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "--network", "host", "--ulimit", "memlock=-1",
           "--ulimit", "stack=67108864"]
    for path in dict.fromkeys(str(Path(p).resolve()) for p in [*paths, *([source] if source else [])]):
        run += ["-v", f"{path}:{path}"]
    return [*run, image, *installed_first(cmd, source)]
