"""`doctor`: whether this machine (the container, its GPUs) can serve a deployment, before serving.

One check per line, each `ok`, `FAIL`, `n/a` (the deployment does not need it) or `cannot check`
(this machine cannot tell, e.g. no GPU); a deployment is ready here only when every check is `ok`
or `n/a`. What the checks read of the machine goes through `Box`, so that tests drive every
failure with a stand-in; `LocalBox` reads the real one.

  versions   TensorRT-LLM (and TensorRT for the engine backend) on the lines the backend runs on
             (recipe/support.py Backend.trtllm_lines / tensorrt_lines)
  gpus       count, compute capability and free memory against the recipe and its memory plan, on
             the deployment's gpu_device_ids (else 0 .. per node - 1)
  driver     the NVIDIA driver against the oldest branch the CUDA of the deployment's image runs on
             (recipe/catalog/images.yaml: CUDA 13 needs 580 or later)
  plugins    the engine backend: TensorRT-LLM's plugin library loads (importing tensorrt_llm
             registers its creators in the `tensorrt_llm` namespace) and our AOT plugins register
  attention  the pytorch backend: the packages its drafter attention imports (DFlash's
             dflash_attention.py: VANILLA flash_attn, FA4 flash_attn.cute and flashinfer,
             TRTLLM flashinfer), which TensorRT-LLM's requirements do not all list
  mpi, nccl  tp x pp > 1: `mpirun` on PATH (TensorRT-LLM 1.2.x's leader mode and
             trtllm-llmapi-launch start ranks with it) and NCCL in torch
  peer       tp > 1: every pair of the ranks' GPUs (the deployment's gpu_device_ids, else 0 ..
             tp - 1) can access each other's memory (the custom all-reduce and NCCL's P2P path
             need it; tensorrt_llm/runtime/generation.py enables it before allocating the
             all-reduce workspace)
  split      the engine backend with the drafter split over the ranks: mpi4py (the ranks' NCCL
             group is set up over MPI: runtime/drafter_ranks.py) and cuda-python's runtime
             (peer access before the drafter's all-reduce workspace: runtime/trt_runners.py)
  files      the deployment and every stage output it was made from: present, their files as
             their manifests record them, and (engine backend) real engines, not a dry run
"""

from __future__ import annotations

import importlib.metadata
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from trtllm_dflash.artifacts import Manifest, check_files, manifest_sha256, planned_build_command, verify_input
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.hardware import GiB
from trtllm_dflash.recipe.plan.planner import plan
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import backend as backend_spec

Status = Literal["ok", "FAIL", "n/a", "cannot check"]
PASSING = ("ok", "n/a")


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str

    def line(self) -> str:
        return f"{self.status:<12} {self.name:<9} {self.detail}"


@dataclass(frozen=True)
class Gpu:
    name: str
    sm: int  # compute capability x10
    total_bytes: int
    free_bytes: int


class Box(Protocol):
    """What doctor reads of the machine."""

    def version(self, package: str) -> str | None: ...  # an installed distribution's version
    def gpus(self) -> list[Gpu]: ...
    def peer_access(self, a: int, b: int) -> bool: ...
    def which(self, program: str) -> str | None: ...
    def nccl_version(self) -> str | None: ...
    def plugins(self) -> tuple[list[str], list[str]]: ...  # (namespaces of registered creators, our plugin ids)
    def importable(self, module: str) -> bool: ...
    def driver_version(self) -> str | None: ...  # the NVIDIA driver, e.g. "580.95.05"; None: none found
    def cuda_driver_api(self) -> int | None: ...  # cuDriverGetVersion here (13010 = 13.1), forward compat included


class LocalBox:
    """This machine: installed distributions, torch's view of the GPUs, PATH, TensorRT's registry."""

    def version(self, package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    def gpus(self) -> list[Gpu]:
        import torch

        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            free, total = torch.cuda.mem_get_info(i)
            out.append(Gpu(torch.cuda.get_device_name(i), 10 * major + minor, total, free))
        return out

    def peer_access(self, a: int, b: int) -> bool:
        import torch

        return torch.cuda.can_device_access_peer(a, b)

    def which(self, program: str) -> str | None:
        return shutil.which(program)

    def nccl_version(self) -> str | None:
        import torch

        if not torch.cuda.is_available() or not hasattr(torch.cuda, "nccl"):
            return None
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)

    def driver_version(self) -> str | None:
        try:
            import pynvml  # nvidia-ml-py, which torch's CUDA wheels and NVIDIA's containers carry

            pynvml.nvmlInit()
            try:
                v = pynvml.nvmlSystemGetDriverVersion()
            finally:
                pynvml.nvmlShutdown()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:  # no NVML library (no driver), or no GPU
            return None

    def cuda_driver_api(self) -> int | None:
        """The CUDA version the driver stack in this container supports: with NVIDIA's
        forward-compatibility package (cuda-compat) newer than the kernel driver's own."""
        try:
            from cuda.bindings import driver
        except ImportError:
            return None
        err, version = driver.cuDriverGetVersion()
        return int(version) if err == driver.CUresult.CUDA_SUCCESS else None

    def importable(self, module: str) -> bool:
        import importlib.util

        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing
            return False

    def plugins(self) -> tuple[list[str], list[str]]:
        import tensorrt as trt
        import tensorrt_llm  # noqa: F401  (loads libnvinfer_plugin_tensorrt_llm: its creators register)

        from trtllm_dflash.plugins.kv_inject_attention.plugin_spec import APPEND_PLUGIN_ID, PLUGIN_ID
        from trtllm_dflash.plugins.kv_inject_attention.trt_plugin import register_plugin

        register_plugin()
        registry = trt.get_plugin_registry()
        creators = list(getattr(registry, "all_creators", ())) or list(registry.plugin_creator_list)
        namespaces = sorted({c.plugin_namespace for c in creators})
        ours = sorted(f"{c.plugin_namespace}::{c.name}" for c in creators
                      if f"{c.plugin_namespace}::{c.name}" in (PLUGIN_ID, APPEND_PLUGIN_ID))
        return namespaces, ours


def _on_line(version: str | None, lines: tuple[str, ...]) -> bool:
    return version is not None and any(version == line or version.startswith(line + ".") for line in lines)


def check_versions(recipe: Recipe, box: Box) -> list[Check]:
    spec = backend_spec(recipe.backend.name)
    if not spec.trtllm_lines:
        return [Check("versions", "n/a", f"the {spec.name} backend runs without TensorRT-LLM")]
    out = []
    for package, lines in (("tensorrt_llm", spec.trtllm_lines), ("tensorrt", spec.tensorrt_lines)):
        if not lines:
            continue
        got, want = box.version(package), " or ".join(f"{line}.x" for line in lines)
        if _on_line(got, lines):
            out.append(Check("versions", "ok", f"{package} {got} ({want})"))
        else:
            out.append(Check("versions", "FAIL", f"{package} {got or 'not installed'}, the {spec.name} backend needs "
                             f"{want}: run inside {spec.container}"))
    return out


def check_gpus(recipe: Recipe, box: Box, device_ids: list[int] | None = None) -> list[Check]:
    """Count, type and free memory of the GPUs the ranks drive: `device_ids` (the deployment's
    gpu_device_ids), 0 .. per node - 1 when None."""
    gpu = recipe.gpu
    if gpu.is_cpu:
        return [Check("gpus", "n/a", "a cpu recipe")]
    found = box.gpus()
    per_node = min(recipe.world_size, gpu.max_per_node)
    if not found:
        return [Check("gpus", "cannot check", f"no CUDA GPU visible here; the recipe needs {per_node} x {gpu.name}")]
    if len(found) < per_node:
        return [Check("gpus", "FAIL", f"{len(found)} GPU(s) visible, the recipe needs {per_node} per node "
                      f"(tp x pp = {recipe.world_size}); CUDA_VISIBLE_DEVICES or the container's --gpus?")]
    if device_ids is not None:
        from trtllm_dflash.runtime.trt_runners import rank_devices  # the rule the deployment's ranks apply

        try:
            rank_devices(recipe.world_size, device_ids, recipe.world_size // per_node)
        except UserError as e:
            return [Check("gpus", "FAIL", str(e))]
    ids = device_ids or list(range(per_node))
    absent = _absent(ids, len(found))
    if absent:
        return [Check("gpus", "FAIL", absent)]
    need = plan(recipe).need_bytes
    out = []
    for i, g in ((i, found[i]) for i in ids):
        if g.sm != gpu.sm:
            out.append(Check("gpus", "FAIL",
                             f"GPU {i} is {g.name} (sm {g.sm}); hardware.gpu {gpu.name} is sm {gpu.sm}"))
        elif g.free_bytes < need:
            out.append(Check("gpus", "FAIL",
                             f"GPU {i} ({g.name}) has {g.free_bytes / GiB:.1f} GiB free; the memory plan "
                             f"needs {need / GiB:.1f} GiB per rank (`trtllm-dflash plan`); another process on it?"))
    if not out:
        free = min(found[i].free_bytes for i in ids) / GiB
        which = "" if device_ids is None else f" (GPUs {', '.join(map(str, ids))})"
        out.append(Check("gpus", "ok",
                         f"{len(ids)} x {found[ids[0]].name}{which} (sm {gpu.sm}), at least {free:.1f} GiB free each, "
                         f"plan needs {need / GiB:.1f} GiB per rank"))
    return out


def deployment_image(recipe: Recipe):
    """The image table's row of the image the deployment names (backend.image, else the backend's
    default for the API `run` serves it through), None when the table does not know it."""
    from trtllm_dflash.recipe import images
    from trtllm_dflash.recipe.containers import backend_image

    spec = backend_spec(recipe.backend.name)
    name = backend_image(spec.name, spec.serving_api, recipe.backend.trtllm_version, recipe.backend.image)
    return images.lookup(name) if name else None


def check_driver(recipe: Recipe, box: Box) -> list[Check]:
    if recipe.gpu.is_cpu or not backend_spec(recipe.backend.name).trtllm_lines:
        return [Check("driver", "n/a", "no NVIDIA container")]
    image, driver = deployment_image(recipe), box.driver_version()
    if driver is None:
        return [Check("driver", "cannot check", "no NVIDIA driver found here (NVML)")]
    if image is None or image.min_driver is None:
        return [Check("driver", "cannot check", f"driver {driver}; the image table does not know the CUDA of "
                      f"{image.ref if image else 'the deployment image'}")]
    major = int(driver.split(".")[0])
    if major >= image.min_driver:
        return [Check("driver", "ok", f"driver {driver} (CUDA {image.cuda} of {image.tag} needs {image.min_driver}+)")]
    need = cuda_api(image.cuda)
    api = box.cuda_driver_api()
    if api is not None and api >= need:  # NVIDIA's forward-compatibility package serves the image's CUDA
        return [Check("driver", "ok",
                      f"driver {driver} with CUDA forward compatibility to {api // 1000}.{api % 1000 // 10} "
                      f"(CUDA {image.cuda} of {image.tag})")]
    return [Check("driver", "FAIL", f"driver {driver} is older than branch {image.min_driver}, which CUDA "
                  f"{image.cuda} in {image.ref} needs, and no CUDA forward-compatibility package serves it here "
                  f"(cuDriverGetVersion {api if api is not None else 'unavailable'} < {need})")]


def cuda_api(cuda: str) -> int:
    """A CUDA version as cuDriverGetVersion reports it: '13.1.0.036' -> 13010."""
    major, minor = (int(x) for x in cuda.split(".")[:2])
    return 1000 * major + 10 * minor


def check_plugins(recipe: Recipe, box: Box) -> list[Check]:
    from trtllm_dflash.plugins.kv_inject_attention.plugin_spec import APPEND_PLUGIN_ID, PLUGIN_ID

    if not backend_spec(recipe.backend.name).builds_engines:
        return [Check("plugins", "n/a", f"the {recipe.backend.name} backend loads no TensorRT plugins of ours")]
    if box.version("tensorrt_llm") is None or box.version("tensorrt") is None:
        return [Check("plugins", "cannot check", "TensorRT-LLM / TensorRT not installed here")]
    try:
        namespaces, ours = box.plugins()
    except Exception as e:  # the plugin library or our registration failed: say what it raised
        return [Check("plugins", "FAIL", f"loading TensorRT-LLM's plugin library and registering ours raised "
                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")]
    missing = [p for p in (PLUGIN_ID, APPEND_PLUGIN_ID) if p not in ours]
    if "tensorrt_llm" not in namespaces:
        return [Check("plugins", "FAIL", "no plugin creator in the tensorrt_llm namespace: TensorRT-LLM's plugin "
                      "library did not load")]
    if missing:
        return [Check("plugins", "FAIL", f"{missing[0]} is not registered with TensorRT")]
    return [Check("plugins", "ok", f"TensorRT-LLM's plugin library and {', '.join(ours)}")]


# The modules each drafter attention backend of TensorRT-LLM's DFlash imports at model build
# (tensorrt_llm/_torch/speculative/dflash_attention.py).
ATTENTION_MODULES = {"VANILLA": ("flash_attn",), "FA4": ("flash_attn.cute", "flashinfer"), "TRTLLM": ("flashinfer",)}


def check_attention(recipe: Recipe, box: Box) -> list[Check]:
    from trtllm_dflash.recipe.trtllm_api import drafter_attention

    if not backend_spec(recipe.backend.name).static_schedule:
        return [Check("attention", "n/a", f"the {recipe.backend.name} backend's drafter attention is ours")]
    attention = drafter_attention(recipe.backend.drafter_attention, recipe.gpu.is_blackwell)
    absent = [m for m in ATTENTION_MODULES[attention] if not box.importable(m)]
    if absent:
        return [Check("attention", "FAIL", f"the drafter's attention_backend {attention} imports {absent[0]}, which "
                      "is not installed here; install it in the container or set backend.drafter_attention")]
    return [Check("attention", "ok", f"{attention}: {', '.join(ATTENTION_MODULES[attention])} importable")]


def check_parallel(recipe: Recipe, box: Box, device_ids: list[int] | None = None) -> list[Check]:
    """mpi, nccl, peer and split; `device_ids`: the GPUs the ranks drive (the deployment's
    gpu_device_ids), 0 .. tp - 1 when None."""
    world, tp = recipe.world_size, recipe.parallel.tp
    if world == 1:
        return [Check("mpi", "n/a", "one rank"), Check("peer", "n/a", "one rank")]
    out = [Check("mpi", "ok", f"mpirun: {box.which('mpirun')}") if box.which("mpirun") else
           Check("mpi", "FAIL",
                 f"no mpirun on PATH; {world} ranks start under MPI (the TensorRT-LLM containers have it)")]
    out += check_split(recipe, box)
    nccl = box.nccl_version()
    found = box.gpus()
    if not found:
        return out + [Check("nccl", "cannot check", "no CUDA GPU visible here"),
                      Check("peer", "cannot check", "no CUDA GPU visible here")]
    out.append(Check("nccl", "ok", f"NCCL {nccl}") if nccl else Check("nccl", "FAIL", "torch has no NCCL"))
    return out + [check_peer(device_ids or list(range(tp)), len(found), box)]


def _absent(ids: list[int], visible: int) -> str | None:
    """The line for an id past the GPUs visible here, None when all are there."""
    absent = [g for g in ids if g >= visible]
    return f"gpu_device_ids names GPU {absent[0]}, but {visible} GPU(s) are visible here" if absent else None


def check_peer(ranks: list[int], visible: int, box: Box) -> Check:
    absent = _absent(ranks, visible)
    if absent:
        return Check("peer", "FAIL", absent)
    blocked = [(a, b) for a in ranks for b in ranks if a != b and not box.peer_access(a, b)]
    if blocked:
        a, b = blocked[0]
        return Check("peer", "FAIL", f"GPU {a} cannot access GPU {b}'s memory ({len(blocked)} pair(s) blocked); "
                     "tp > 1 needs peer access between the ranks' GPUs (NVLink / P2P; `nvidia-smi topo -m`)")
    return Check("peer", "ok", f"every pair of GPUs {','.join(map(str, ranks))} can access each other")


# What a split drafter imports on every rank: its NCCL group's address travels over MPI, and peer
# access is enabled through cuda-python's runtime (cuda.bindings from 12.6, cuda.cudart before).
SPLIT_MODULES = (("mpi4py", ("mpi4py",)), ("cuda-python", ("cuda.bindings.runtime", "cuda.cudart")))


def check_split(recipe: Recipe, box: Box) -> list[Check]:
    from trtllm_dflash.recipe.plan.drafter import drafter_placement

    if not backend_spec(recipe.backend.name).builds_engines or drafter_placement(recipe).mode != "split":
        return []
    missing = [name for name, modules in SPLIT_MODULES if not any(box.importable(m) for m in modules)]
    if missing:
        return [Check("split", "FAIL", f"the drafter is split over the {recipe.parallel.tp} ranks, which needs "
                      f"{missing[0]} importable here (pip install {missing[0]} inside the container)")]
    return [Check("split", "ok", "the split drafter's mpi4py and cuda-python import")]


def _input_dir(directory: Path, m: Manifest) -> Path | None:
    if not m.input:
        return None
    path = Path(m.input["path"])
    return path if path.is_absolute() else (directory / path).resolve()


def check_files_chain(recipe: Recipe, deploy_dir: Path) -> list[Check]:
    """The deployment and every stage output it was made from, newest first."""
    out, directory, expected_sha, chain, served = [], Path(deploy_dir), None, [], None
    try:
        verify_input(directory, ("deploy",), recipe, check_contents=False)
    except UserError as e:
        return [Check("files", "FAIL", str(e))]
    while directory is not None:
        chain.append(directory.resolve())
        try:
            m = Manifest.read(directory)
            if expected_sha is not None and manifest_sha256(directory) != expected_sha:
                raise UserError(f"{directory}: its manifest changed since the next stage was made from it; re-run "
                                "the stages after it")
            edited = check_files(directory, m)
            if m.stage == "deploy" and edited:
                served = _check_settings(recipe, directory)
        except UserError as e:
            return out + [Check("files", "FAIL", str(e))]
        if m.stage == "build" and m.extra.get("dry_run"):
            return out + [Check("files", "FAIL", f"{directory}: a dry-run build (no engines); build them here: "
                                f"`{planned_build_command(recipe, directory)}` inside "
                                f"{backend_spec('engine').container}")]
        note = f"; edited since: {', '.join(edited)}" if edited else ""
        out.append(Check("files", "ok", f"{m.stage}: {directory} ({len(m.files)} files as recorded{note})"))
        expected_sha = m.input["manifest_sha256"] if m.input else None
        directory = _input_dir(directory, m)
        if directory is not None and not directory.is_dir():
            return out + [Check("files", "FAIL", f"{directory}: missing (the {m.input['stage']} output this stage was "
                                "made from); mount it where the deployment expects it")]
    for name in ("checkpoint", "engine_dir"):  # what the model opens is what was checked
        path = None if served is None else getattr(served, name)
        if path is not None and Path(path).resolve() not in chain:
            return out + [Check("files", "FAIL", f"{deploy_dir}: config.pbtxt parameter {name} names {path}, not a "
                                "stage output this deployment was made from (checked above); deploy again from the "
                                "output to serve")]
    return out


def _check_settings(recipe: Recipe, deploy_dir: Path):
    """An edited dflash model's config.pbtxt still loads: every parameter known, of its type
    (an LLM-API model is upstream's, its parameters upstream's). Its settings, paths resolved
    (None: no such model)."""
    from trtllm_dflash.deploy.settings import REPOSITORY, model_settings

    model_dir = Path(deploy_dir) / REPOSITORY / recipe.serve.model_name
    if backend_spec(recipe.backend.name).triton_model == "llmapi" or not (model_dir / "config.pbtxt").is_file():
        return None
    return model_settings(model_dir).resolved(deploy_dir)


def deployed_device_ids(recipe: Recipe, deploy_dir: Path) -> list[int] | None:
    """The GPUs the deployment's ranks drive (config.pbtxt gpu_device_ids), None when it names none."""
    from trtllm_dflash.deploy.settings import repository_model

    try:
        _, settings = repository_model(deploy_dir, recipe.serve.model_name)
    except UserError:  # no dflash model there (the pytorch backend's), or unreadable: files says why
        return None
    return settings.device_ids


def doctor(recipe: Recipe, deploy_dir: Path, box: Box | None = None) -> list[Check]:
    """Every check of the module docstring for serving `deploy_dir` (a deploy output of `recipe`) here."""
    box, ids = box or LocalBox(), deployed_device_ids(recipe, deploy_dir)
    return [*check_versions(recipe, box), *check_gpus(recipe, box, ids), *check_driver(recipe, box),
            *check_plugins(recipe, box), *check_attention(recipe, box), *check_parallel(recipe, box, ids),
            *check_files_chain(recipe, deploy_dir)]


def ready(checks: list[Check]) -> bool:
    return all(c.status in PASSING for c in checks)
