"""Open what `deploy` wrote for the reference backend: one loader for every front end.

The Triton model (serve/triton_model.py) and the OpenAI-compatible server (serve/openai.py)
serve the same deployment through the same engine: the checkpoint deploy recorded (checked
against its manifest checksum and file checksums), opened by checkpoint_runner.open_checkpoint
(tp worker processes when the checkpoint is sharded), the target's tokenizer, and one
in-flight batching ServingEngine (serve/batcher.py) set up from the deployed recipe.

Inputs are the model's settings (deploy/settings.py ModelSettings: its config.pbtxt parameters,
as Triton hands them to `initialize`) and its version directory; `repository_model` reads both
from a deploy output.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.deploy.settings import ModelSettings, repository_model  # noqa: F401  (read here by every front end)
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.hardware import cpu_torch_threads
from trtllm_dflash.serve.requests import Limits


@dataclass
class Deployed:
    recipe: object  # the deployed recipe (Recipe)
    model: object  # a batcher.ServingModel: LocalModel | ShardedModel | EngineModel
    tokenizer: object
    engine: object  # ServingEngine
    limits: Limits
    mode: str  # "dflash" | "ddtree"
    checkpoint: Path
    tp: int
    stage: str  # "convert" | "quantize"

    def close(self) -> None:
        self.engine.stop()
        self.model.close()


def open_deployed(version_dir: Path, settings: ModelSettings, on_fatal=None) -> Deployed | None:
    """The deployment, ready to serve; None on a tensor-parallel rank > 0 of the engine backend's
    TensorRT runners, once the leader has stopped (that rank only ran the target's shard).
    on_fatal(reason): called once when the model can no longer serve (ServingEngine)."""
    import torch
    from transformers import AutoTokenizer

    from trtllm_dflash.artifacts import check_files, manifest_sha256
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.runtime.checkpoint import read_checkpoint
    from trtllm_dflash.runtime.checkpoint_runner import open_checkpoint
    from trtllm_dflash.serve.batcher import ServingEngine
    from trtllm_dflash.serve.trace import from_env

    s = settings.resolved(deploy_dir_of(version_dir))
    recipe = load_recipe(Path(version_dir) / s.recipe, check_rules=False)
    threads = s.torch_threads or default_torch_threads(recipe)
    if threads:
        torch.set_num_threads(threads)
    # Serve exactly the artifact deploy recorded: same manifest, files unchanged (the engines for
    # the tensorrt runners; the checkpoint, which also holds the tokenizer, for the others).
    runners = s.runners
    if s.checkpoint is None:
        raise UserError(f"{version_dir}: the deployment records no checkpoint (deploy from a build output made with "
                        "--from): its tokenizer and the CPU runners' weights are there")
    checkpoint = Path(s.checkpoint)
    if manifest_sha256(checkpoint) != s.checkpoint_manifest_sha256:
        raise UserError(f"{checkpoint}: manifest.json changed since deploy; deploy again")
    info = read_checkpoint(checkpoint)
    if runners == "tensorrt":
        _check_engines(recipe, Path(s.engine_dir))
    else:
        check_files(checkpoint, info.manifest)
    if info.tokenizer_dir is None:
        raise UserError(f"{checkpoint}: no tokenizer/ (the target had no tokenizer files); serving speaks text")
    spec, build = recipe.speculative, recipe.build
    if runners == "tensorrt":  # the engines the build stage made (GPU, TensorRT-LLM 1.2.x)
        from trtllm_dflash.runtime.trt_runners import WorkerRank, open_trt_engine

        model = open_trt_engine(Path(s.engine_dir), free_gpu_memory_fraction=s.kv_cache_free_gpu_mem_fraction,
                                device_ids=s.device_ids)
        if isinstance(model, WorkerRank):  # a tp rank > 0: it serves the leader's steps until the leader stops
            model.serve()
            return None
    else:
        model = open_checkpoint(checkpoint, runners=runners, max_seq_len=build.max_seq_len)
    tokenizer = AutoTokenizer.from_pretrained(info.tokenizer_dir)
    mode = "ddtree" if spec.ddtree_budget else "dflash"
    # The engine thread detokenizes with its own copy: a fast tokenizer is not safe to share across
    # threads ("Already borrowed"), and every front end tokenizes requests on threads of its own.
    engine = ServingEngine(
        model, copy.deepcopy(tokenizer), mode=mode, block_size=spec.block_size, ddtree_budget=spec.ddtree_budget,
        max_seq_len=build.max_seq_len, max_batch_size=build.max_batch_size, policy=draft_policy(recipe, model),
        trace=from_env(), on_fatal=on_fatal,
    )
    return Deployed(recipe, model, tokenizer, engine, Limits(build.max_input_len, build.max_seq_len), mode,
                    checkpoint, info.tp, info.manifest.stage)


def _check_engines(recipe, engines: Path) -> None:
    """The build output the tensorrt runners open: engines built (not a dry run), files unchanged."""
    from trtllm_dflash.artifacts import Manifest, check_files, planned_build_command
    from trtllm_dflash.recipe.support import backend as backend_spec

    built = Manifest.read(engines)
    if built.extra.get("dry_run"):
        raise UserError(f"{engines}: a dry-run build (no engines) cannot serve with the tensorrt runners; inside "
                        f"{backend_spec(recipe.backend.name).container} run {planned_build_command(recipe, engines)} "
                        "and deploy again")
    check_files(engines, built)


def default_torch_threads(recipe) -> int:
    """Torch threads of a server that decodes in its own process: recipe/hardware.py
    cpu_torch_threads on CPU at tp 1; 0 (torch's default) on GPUs, and with tp > 1, whose worker
    processes set their own."""
    if not recipe.gpu.is_cpu or recipe.parallel.tp > 1:
        return 0
    return cpu_torch_threads(1)


def draft_policy(recipe, model):
    """Each round's draft length: the recipe's bands, `auto` (live acceptance x the verify cost
    of chain rounds, measured here at start-up; DDTree rounds choose among tree budgets, chains
    and plain decoding on it), or FULL_BLOCK (block_size - 1 always)."""
    from trtllm_dflash.policy.auto import AutoConfig, AutoDraftLength
    from trtllm_dflash.policy.bands import Bands
    from trtllm_dflash.policy.cost import measure_cost
    from trtllm_dflash.policy.decision import FULL_BLOCK
    from trtllm_dflash.policy.trees import tree_budget_menu
    from trtllm_dflash.reference.verify import SamplingParams

    spec = recipe.speculative
    if spec.bands:
        return Bands(spec.band_pairs, spec.block_size)
    if not spec.auto:
        return FULL_BLOCK
    made = []

    def decoder(max_len):  # measure_cost is done with the previous decoder when it asks for the next
        if made:
            model.release(made.pop())
        made.append(model.decoder(sampling=SamplingParams(), mode="dflash", block_size=spec.block_size,
                                  ddtree_budget=spec.ddtree_budget, max_len=max_len))
        return made[-1]

    vocab = recipe.target_facts.vocab_size
    try:
        cost = measure_cost(decoder, spec.block_size, vocab)
    finally:
        for d in made:
            model.release(d)
    return AutoDraftLength(spec.block_size, cost, AutoConfig(tree_budgets=tree_budget_menu(spec.ddtree_budget)))


def deploy_dir_of(version_dir: Path) -> Path:
    """The deploy output of a model's version directory (DEPLOY/model_repository/NAME/1): what
    the settings' paths are relative to."""
    return Path(version_dir).resolve().parents[2]
