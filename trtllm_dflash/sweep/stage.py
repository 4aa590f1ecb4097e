"""The `sweep` stage: measure a running server over the recipe's concurrency levels.

Writes OUT/ atomically with a manifest (results.jsonl, summary.csv, summary.json, sweep.png):
a sweep that is interrupted leaves no directory that looks finished. When the server serves
a deploy output of this pipeline (`from_dir`), the manifest names it as its input, so `run`
knows whether the measurement is still current.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir
from trtllm_dflash.prompts.sources import load_prompts
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.sweep.loadgen import SweepResult, openai_model, run_sweep
from trtllm_dflash.sweep.metrics import LevelSummary

SUMMARY = "summary.json"


def sweep(recipe: Recipe, url: str, out: Path, *, levels: list[int] | None = None, protocol: str = "grpc",
          temperature: float = 0.0, from_dir: Path | None = None, model: str | None = None,
          note: dict | None = None) -> SweepResult:
    """Run the load generator against `url` and write OUT (replacing an earlier sweep of this recipe).
    protocol: "grpc" / "http" (Triton, the dflash model) or "openai" (/v1/completions of any
    OpenAI-compatible server; the model id is `model`, else the recipe's serve.model_name when the
    server lists it, else the server's only model). `note`: more facts about the server for the
    manifest (e.g. which runners served it)."""
    sw = recipe.sweep
    levels = levels or sw.concurrency
    name = model or recipe.serve.model_name
    if protocol == "openai":
        name = openai_model(url, name) if model is None else name
    prompts = load_prompts(sw.dataset, max(sw.requests_at(c) for c in levels) + sw.warmup_requests, sw.input_len, sw.seed)
    manifest = Manifest.for_stage("sweep", recipe, from_dir, extra={
        "url": url, "protocol": protocol, "levels": levels, "temperature": temperature, "model": name, **(note or {})})
    gpus = 1 if recipe.gpu.is_cpu else recipe.world_size
    with atomic_stage_dir(out, manifest, overwrite=True) as tmp:
        result = run_sweep(url, name, levels, sw.requests_at, sw.warmup_requests, prompts,
                           sw.output_len, gpus=gpus, out_dir=tmp, seed=sw.seed, temperature=temperature,
                           title=f"{recipe.name} ({recipe.hardware.count}x {recipe.hardware.gpu}, {recipe.backend.name})",
                           protocol=protocol)
        manifest.extra["failed"] = sum(level.failed for level in result.levels)
    result.out_dir = Path(out)
    return result


def read_summary(out: Path) -> list[LevelSummary]:
    """The level summaries of a finished sweep directory."""
    return [LevelSummary.from_json(d) for d in json.loads((Path(out) / SUMMARY).read_text())]
