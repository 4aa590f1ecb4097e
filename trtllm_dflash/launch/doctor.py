"""`doctor`: whether this machine (the container, its GPUs) can serve a deployment, before serving.

One check per line, each `ok`, `FAIL`, `n/a` (the deployment does not need it) or `cannot check`
(this machine cannot tell, e.g. no GPU); a deployment is ready here only when every check is `ok`
or `n/a`. What the checks read of the machine goes through `Box`, so that tests drive every
failure with a stand-in; `LocalBox` reads the real one.

  versions   TensorRT-LLM (and TensorRT for the engine backend) on the lines the backend runs on
             (recipe/support.py Backend.trtllm_lines / tensorrt_lines)
  gpus       count, compute capability and free memory against the recipe and its memory plan
  plugins    the engine backend: TensorRT-LLM's plugin library loads (importing tensorrt_llm
             registers its creators in the `tensorrt_llm` namespace) and our AOT plugins register
  attention  the pytorch backend: the packages its drafter attention imports (DFlash's
             dflash_attention.py: VANILLA flash_attn, FA4 flash_attn.cute and flashinfer,
             TRTLLM flashinfer), which TensorRT-LLM's requirements do not all list
  mpi, nccl  tp x pp > 1: `mpirun` on PATH (TensorRT-LLM 1.2.x's leader mode and
             trtllm-llmapi-launch start ranks with it) and NCCL in torch
  peer       tp > 1: every pair of the ranks' GPUs can access each other's memory (the custom
             all-reduce and NCCL's P2P path need it; tensorrt_llm/runtime/generation.py enables
             it before allocating the all-reduce workspace)
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
from trtllm_dflash.recipe.planner import plan
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


def check_gpus(recipe: Recipe, box: Box) -> list[Check]:
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
    need = plan(recipe).need_bytes
    out = []
    for i, g in enumerate(found[:per_node]):
        if g.sm != gpu.sm:
            out.append(Check("gpus", "FAIL", f"GPU {i} is {g.name} (sm {g.sm}); hardware.gpu {gpu.name} is sm {gpu.sm}"))
        elif g.free_bytes < need:
            out.append(Check("gpus", "FAIL", f"GPU {i} ({g.name}) has {g.free_bytes / GiB:.1f} GiB free; the memory plan "
                             f"needs {need / GiB:.1f} GiB per rank (`trtllm-dflash plan`); another process on it?"))
    if not out:
        free = min(g.free_bytes for g in found[:per_node]) / GiB
        out.append(Check("gpus", "ok", f"{per_node} x {found[0].name} (sm {gpu.sm}), at least {free:.1f} GiB free each, "
                         f"plan needs {need / GiB:.1f} GiB per rank"))
    return out


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


def check_parallel(recipe: Recipe, box: Box) -> list[Check]:
    world, tp = recipe.world_size, recipe.parallel.tp
    if world == 1:
        return [Check("mpi", "n/a", "one rank"), Check("peer", "n/a", "one rank")]
    out = [Check("mpi", "ok", f"mpirun: {box.which('mpirun')}") if box.which("mpirun") else
           Check("mpi", "FAIL", f"no mpirun on PATH; {world} ranks start under MPI (the TensorRT-LLM containers have it)")]
    nccl = box.nccl_version()
    found = box.gpus()
    if not found:
        return out + [Check("nccl", "cannot check", "no CUDA GPU visible here"),
                      Check("peer", "cannot check", "no CUDA GPU visible here")]
    out.append(Check("nccl", "ok", f"NCCL {nccl}") if nccl else Check("nccl", "FAIL", "torch has no NCCL"))
    ranks = list(range(min(tp, len(found))))
    blocked = [(a, b) for a in ranks for b in ranks if a != b and not box.peer_access(a, b)]
    if blocked:
        a, b = blocked[0]
        out.append(Check("peer", "FAIL", f"GPU {a} cannot access GPU {b}'s memory ({len(blocked)} pair(s) blocked); "
                         "tp > 1 needs peer access between the ranks' GPUs (NVLink / P2P; `nvidia-smi topo -m`)"))
    else:
        out.append(Check("peer", "ok", f"every pair of GPUs 0-{ranks[-1]} can access each other"))
    return out


def _input_dir(directory: Path, m: Manifest) -> Path | None:
    if not m.input:
        return None
    path = Path(m.input["path"])
    return path if path.is_absolute() else (directory / path).resolve()


def check_files_chain(recipe: Recipe, deploy_dir: Path) -> list[Check]:
    """The deployment and every stage output it was made from, newest first."""
    out, directory, expected_sha = [], Path(deploy_dir), None
    try:
        verify_input(directory, ("deploy",), recipe, check_contents=False)
    except UserError as e:
        return [Check("files", "FAIL", str(e))]
    while directory is not None:
        try:
            m = Manifest.read(directory)
            if expected_sha is not None and manifest_sha256(directory) != expected_sha:
                raise UserError(f"{directory}: its manifest changed since the next stage was made from it; re-run "
                                "the stages after it")
            check_files(directory, m)
        except UserError as e:
            return out + [Check("files", "FAIL", str(e))]
        if m.stage == "build" and m.extra.get("dry_run"):
            return out + [Check("files", "FAIL", f"{directory}: a dry-run build (no engines); build them here: "
                                f"`{planned_build_command(recipe, directory)}` inside {backend_spec('engine').container}")]
        out.append(Check("files", "ok", f"{m.stage}: {directory} ({len(m.files)} files as recorded)"))
        expected_sha = m.input["manifest_sha256"] if m.input else None
        directory = _input_dir(directory, m)
        if directory is not None and not directory.is_dir():
            return out + [Check("files", "FAIL", f"{directory}: missing (the {m.input['stage']} output this stage was "
                                "made from); mount it where the deployment expects it")]
    return out


def doctor(recipe: Recipe, deploy_dir: Path, box: Box | None = None) -> list[Check]:
    """Every check of the module docstring for serving `deploy_dir` (a deploy output of `recipe`) here."""
    box = box or LocalBox()
    return [*check_versions(recipe, box), *check_gpus(recipe, box), *check_plugins(recipe, box),
            *check_attention(recipe, box), *check_parallel(recipe, box), *check_files_chain(recipe, deploy_dir)]


def ready(checks: list[Check]) -> bool:
    return all(c.status in PASSING for c in checks)
