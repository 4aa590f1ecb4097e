"""Where a deployment's processes run: nodes, processes per node and GPUs per node.

One rule, read by `check` (rules.py: a recipe that cannot be laid out fails before anything is
built), by deploy (the `srun` line of trtllm_serve/launch.json) and by the cluster launchers
(serve/cluster.py: the sbatch script and the LeaderWorkerSet manifest):

- pytorch backend: an MPI world of tp x pp ranks, one per GPU. Up to a node's GPUs
  (`max_per_node` of the hardware catalog) it fills one node; beyond, whole nodes only: every
  rank takes GPU `global_rank % device_count` of its node (TensorRT-LLM
  tensorrt_llm/executor/base_worker.py `BaseWorker._get_comm_ranks_device_id`, read on the main
  line, commit 000bd1a6), so ranks are laid out node by node and every node must hold the same
  number of them. `hardware.count` above a node's GPUs must likewise be whole nodes.
- engine backend: one node, one launcher process: an mpirun of one tritonserver per rank, the
  target Executor in leader mode (serve/launch.py leader_ranks_command, docs/engine-tp.md), as
  upstream's triton_backend/scripts/launch_triton_server.py launches it; the runners open their
  GPUs by local device id (serve/trt_runners.py open_trt_engine), so one node.
- reference backend: this machine (serve runs it in-process); no cluster placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import BACKENDS, backend as backend_spec


@dataclass(frozen=True)
class Placement:
    nodes: int
    tasks_per_node: int  # processes per node (MPI ranks for the pytorch backend)
    gpus_per_node: int  # GPUs each node gives the deployment
    node_gpus: int  # GPUs a node of this kind has

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def whole_nodes(self) -> bool:
        return self.gpus_per_node == self.node_gpus


def span_problem(recipe: Recipe) -> tuple[str, str] | None:
    """(field, message) when the recipe's GPUs cannot be laid out on nodes, else None."""
    gpu, backend = recipe.gpu, recipe.backend.name
    per_node, count, world = gpu.max_per_node, recipe.hardware.count, recipe.world_size
    if count <= per_node and world <= per_node:
        return None
    spec = backend_spec(backend)
    if not spec.spans_nodes and count > per_node:
        why = ("its ranks are one mpirun of leader-mode servers on one node" if spec.needs_gpu
               else "it serves from this machine")
        spanning = ", ".join(n for n, b in BACKENDS.items() if b.spans_nodes)
        return "hardware.count", (f"{count} > {per_node} {gpu.name} per node: only the {spanning} backend spans nodes; "
                                  f"the {backend} backend runs on one node: {why}")
    if count % per_node:
        return "hardware.count", (f"{count} {gpu.name} span nodes of {per_node}: use whole nodes (a multiple of "
                                  f"{per_node}) or at most {per_node}")
    if world > per_node and world % per_node:
        return "parallel.tp", (f"tp*pp = {world} ranks span nodes of {per_node} {gpu.name}: every node must hold "
                               f"the same number of ranks; use a multiple of {per_node} or at most {per_node}")
    return None


def placement(recipe: Recipe) -> Placement:
    """Nodes, processes per node and GPUs per node of the recipe's GPU deployment; a one-line
    UserError for the reference backend and for a layout `span_problem` refuses."""
    spec = backend_spec(recipe.backend.name)
    if not spec.needs_gpu:
        gpu_backends = " and ".join(n for n, b in BACKENDS.items() if b.needs_gpu)
        raise UserError(f"the {spec.name} backend serves from this machine (`trtllm-dflash serve` without --launcher); "
                        f"cluster launchers run the {gpu_backends} backends in NVIDIA's containers")
    problem = span_problem(recipe)
    if problem is not None:
        raise UserError(f"{problem[0]}: {problem[1]}")
    world, per_node = recipe.world_size, recipe.gpu.max_per_node
    if not spec.spans_nodes:  # one process (mpirun's leader-mode servers) holds the node's ranks
        return Placement(nodes=1, tasks_per_node=1, gpus_per_node=world, node_gpus=per_node)
    nodes = 1 if world <= per_node else world // per_node
    return Placement(nodes=nodes, tasks_per_node=world // nodes, gpus_per_node=world // nodes, node_gpus=per_node)
