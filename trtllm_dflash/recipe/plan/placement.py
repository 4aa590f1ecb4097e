"""Where a deployment's processes run: nodes, processes per node and GPUs per node.

One rule, read by `check` (rules.py: a recipe that cannot be laid out fails before anything is
built), by deploy (the `srun` line of trtllm_serve/launch.json) and by the cluster launchers
(launch/cluster.py: the sbatch script and the LeaderWorkerSet manifest):

- pytorch backend: an MPI world of tp x pp ranks, one per GPU. Up to a node's GPUs
  (`max_per_node` of the hardware catalog) it fills one node; beyond, whole nodes only: every
  rank takes GPU `global_rank % device_count` of its node (TensorRT-LLM
  tensorrt_llm/executor/base_worker.py `BaseWorker._get_comm_ranks_device_id`, read on the main
  line, commit 000bd1a6), so ranks are laid out node by node and every node must hold the same
  number of them. `hardware.count` above a node's GPUs must likewise be whole nodes.
- engine backend: one node, one launcher process: an mpirun of one tritonserver per rank, the
  target Executor in leader mode (launch/node_command.py leader_ranks_command, docs/engine-tp.md), as
  upstream's triton_backend/scripts/launch_triton_server.py launches it; the runners open their
  GPUs by local device id (runtime/trt_runners.py open_trt_engine), so one node.
- reference backend: this machine (serve runs it in-process); no cluster placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import BACKENDS
from trtllm_dflash.recipe.support import backend as backend_spec


@dataclass(frozen=True)
class Placement:
    """Where one model copy's processes run, and how many copies (`parallel.replicas`) serve side by
    side, each on GPUs of its own."""

    nodes: int  # nodes of one copy
    tasks_per_node: int  # processes per node (MPI ranks for the pytorch backend)
    gpus_per_node: int  # GPUs each node gives the deployment
    node_gpus: int  # GPUs a node of this kind has
    replicas: int = 1

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def whole_nodes(self) -> bool:
        return self.gpus_per_node == self.node_gpus


def span_problem(recipe: Recipe) -> tuple[str, str] | None:
    """(field, message) when the recipe's GPUs cannot be laid out on nodes, else None. One model
    copy spans nodes only on a backend that can (tp x pp over whole nodes); replicas are copies of
    their own, each within what its backend can span."""
    gpu, backend = recipe.gpu, recipe.backend.name
    per_node, count, world = gpu.max_per_node, recipe.hardware.count, recipe.world_size
    replicas = recipe.parallel.replicas
    if count <= per_node and world <= per_node:
        return None
    spec = backend_spec(backend)
    if not spec.spans_nodes and (world > per_node or count > per_node and replicas == 1):
        why = ("its ranks are one mpirun of leader-mode servers on one node" if spec.needs_gpu
               else "it serves from this machine")
        spanning = ", ".join(n for n, b in BACKENDS.items() if b.spans_nodes)
        more = "; more nodes serve parallel.replicas copies" if spec.needs_gpu else ""
        return "hardware.count", (f"{count} > {per_node} {gpu.name} per node: only the {spanning} backend spans nodes; "
                                  f"the {backend} backend runs on one node: {why}{more}")
    if world > per_node and count % per_node:
        return "hardware.count", (f"{count} {gpu.name} span nodes of {per_node}: use whole nodes (a multiple of "
                                  f"{per_node}) or at most {per_node}")
    if world > per_node and world % per_node:
        return "parallel.tp", (f"tp*pp = {world} ranks span nodes of {per_node} {gpu.name}: every node must hold "
                               f"the same number of ranks; use a multiple of {per_node} or at most {per_node}")
    if replicas == 1 and count > per_node and count % per_node:
        return "hardware.count", (f"{count} {gpu.name} span nodes of {per_node}: use whole nodes (a multiple of "
                                  f"{per_node}) or at most {per_node}")
    return None


def placement(recipe: Recipe) -> Placement:
    """Nodes, processes per node and GPUs per node of one model copy of the recipe's GPU
    deployment, and its replicas; a one-line UserError for the reference backend and for a layout
    `span_problem` refuses."""
    spec = backend_spec(recipe.backend.name)
    if not spec.needs_gpu:
        gpu_backends = " and ".join(n for n, b in BACKENDS.items() if b.needs_gpu)
        raise UserError(f"the {spec.name} backend serves from this machine (`trtllm-dflash serve` without --launcher); "
                        f"cluster launchers run the {gpu_backends} backends in NVIDIA's containers")
    problem = span_problem(recipe)
    if problem is not None:
        raise UserError(f"{problem[0]}: {problem[1]}")
    world, per_node, replicas = recipe.world_size, recipe.gpu.max_per_node, recipe.parallel.replicas
    if not spec.spans_nodes:  # one process (mpirun's leader-mode servers) holds the node's ranks
        return Placement(nodes=1, tasks_per_node=1, gpus_per_node=world, node_gpus=per_node, replicas=replicas)
    nodes = 1 if world <= per_node else world // per_node
    return Placement(nodes=nodes, tasks_per_node=world // nodes, gpus_per_node=world // nodes, node_gpus=per_node,
                     replicas=replicas)


def scale_out(recipe: Recipe, fits_at: int | None) -> str:
    """How the recipe's GPUs serve, and why, given the smallest tp that fits one copy on a GPU
    (`fits_at`, recipe/planner.py smallest_tp): data-parallel replicas of a copy that fits one node
    (NVLink all-reduces only), or tensor parallelism across nodes for a copy that does not."""
    gpu, par, world = recipe.gpu, recipe.parallel, recipe.world_size
    per_node, domain = gpu.max_per_node, gpu.domain
    copies = f"{par.replicas} replica(s) of tp {par.tp}" + (f" x pp {par.pp}" if par.pp > 1 else "")
    if par.tp > domain:
        if fits_at is not None and fits_at <= domain:
            return (f"{copies}: tp {par.tp} spans {par.tp // domain} NVLink domains of {domain} {gpu.name}, its "
                    f"all-reduces cross the inter-node fabric, though one copy fits one domain (from tp {fits_at}): "
                    f"parallel.tp {domain} with parallel.replicas {par.replicas * par.tp // domain} keeps them on "
                    "NVLink")
        return (f"{copies}: tp {par.tp} spans {par.tp // domain} NVLink domains because one copy needs more than "
                f"{domain} {gpu.name} (smallest tp that fits: {fits_at or 'none'}); its all-reduces cross the fabric")
    nodes = -(-par.replicas * world // per_node)
    return f"{copies} on {nodes} node(s) of {per_node} {gpu.name}: every all-reduce stays on NVLink"
