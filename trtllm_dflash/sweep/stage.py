"""The `sweep` stage: measure a running server over the recipe's concurrency levels.

One sweep measures every curve on the same server with the same prompts and seeds: AR beside
DFlash (and DDTree when the recipe has speculative.ddtree_budget) by default, each request
saying how it wants to be decoded (the dflash model's per-request `mode` input; speculation off
is a per-request setting of the server, not a second deployment). `--tune` measures the
server's own draft-length policy beside fixed draft lengths (the per-request `draft_len`) and
writes the best static bands (sweep/tune.py).

Writes OUT/ atomically with a manifest (results.jsonl, summary.csv, summary.json, sweep.png:
sweep/summary.py): a sweep that is interrupted leaves no directory that looks finished. When
the server serves a deploy output of this pipeline (`from_dir`), the manifest names it as its
input, so `run` knows whether the measurement is still current.

The door (`run`, the contract: recipe/stages.py) is what the pipeline calls: it serves the
deploy output here (serve/stage.py served_here) and sweeps it. Stale when: the recipe fields
sweep depends on or its deploy input changed, or the levels, the runners or the curves differ,
or the last sweep had failed requests.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir
from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.sources import load_prompts
from trtllm_dflash.recipe import Recipe
from trtllm_dflash.recipe.stages import StageOptions
from trtllm_dflash.recipe.support import backend as backend_spec
from trtllm_dflash.reference.generate import MODES
from trtllm_dflash.serve.stage import served_here, serving_runners
from trtllm_dflash.sweep import summary as files
from trtllm_dflash.sweep.loadgen import SweepResult, Variant, run_sweep
from trtllm_dflash.sweep.metrics import LevelSummary
from trtllm_dflash.sweep.protocols import ENGINE_DATA, OUTPUTS, ModelIO, is_dynamo, openai_model
from trtllm_dflash.sweep.tune import fixed_curve

NAME = "sweep"
WRITES_OUTPUT = True


def fingerprint(recipe: Recipe, options: StageOptions) -> dict:
    return {"levels": options.levels or recipe.sweep.concurrency, "runners": serving_runners(recipe),
            "curves": [v.name for v in sweep_variants(recipe)]}


def run(recipe: Recipe, input_dir: Path | None, out: Path, options: StageOptions) -> SweepResult:
    """Serve the deploy output `input_dir` on this machine and sweep it into `out`; a sweep with
    failed requests is an error (its results stay in `out` for reading)."""
    with served_here(recipe, input_dir, options.say) as endpoints:
        result = sweep(recipe, endpoints.grpc_url, out, levels=options.levels, from_dir=input_dir,
                       note={"runners": serving_runners(recipe)},
                       metrics_url=f"http://{endpoints.host}:{endpoints.metrics_port}/metrics")
    failed = sum(s.failed for s in result.levels)
    if failed:
        raise UserError(f"sweep: {failed} requests failed; see {out / 'results.jsonl'}")
    return result


def served_mode(recipe: Recipe) -> str:
    """What the deployment decodes for a request that names no mode (serve/deployed.py)."""
    return "ddtree" if recipe.speculative.ddtree_budget and backend_spec(recipe.backend.name).ddtree else "dflash"


def default_modes(recipe: Recipe, protocol: str = "grpc", dynamo: bool = False) -> list[str]:
    """AR, DFlash and (with a budget) DDTree; against an OpenAI-compatible server only the
    server's own mode (other servers know no per-request mode: name them with --modes), except
    behind Dynamo's frontend over our worker (serve --api dynamo off the pytorch backend), which
    takes each request's mode; Dynamo's stock TensorRT-LLM workers (the pytorch backend) do not."""
    ours_behind_dynamo = dynamo and backend_spec(recipe.backend.name).triton_model != "llmapi"
    if protocol == "openai" and not ours_behind_dynamo:
        return [served_mode(recipe)]
    return ["ar", "dflash"] + (["ddtree"] if recipe.speculative.ddtree_budget else [])


def sweep_variants(recipe: Recipe, modes: list[str] | None = None, protocol: str = "grpc",
                   tune: list[int] | None = None, dynamo: bool = False) -> list[Variant]:
    """The curves of a sweep. modes: see default_modes. tune: draft lengths to measure beside the
    server's policy (curves "<mode> L=<n>" and "<mode>", the server's own choice per round)."""
    if tune is not None:
        mode = served_mode(recipe)
        bad = [n for n in tune if not 0 <= n <= recipe.speculative.block_size - 1]
        if bad or not tune:
            raise UserError(f"--tune-draft-lens: expected draft lengths in 0..{recipe.speculative.block_size - 1} "
                            f"(block_size - 1), got {tune}")
        explicit = None if protocol == "openai" else mode  # the default needs no request extension
        return [Variant(fixed_curve(mode, n), explicit, n) for n in sorted(set(tune))] + [Variant(mode, explicit)]
    modes = modes or default_modes(recipe, protocol, dynamo)
    for m in modes:
        if m not in MODES:
            raise UserError(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    if "ddtree" in modes and not recipe.speculative.ddtree_budget:
        raise UserError("--modes ddtree: the recipe has no speculative.ddtree_budget (the deployment decodes no trees)")
    if len(set(modes)) != len(modes):
        raise UserError(f"--modes: {','.join(modes)} names a mode twice")
    served = served_mode(recipe)
    # Triton's dflash model takes the mode of every request; an OpenAI server gets the extension
    # only for modes other than its own, so any OpenAI-compatible server can be swept for that one.
    return [Variant(m, None if protocol == "openai" and m == served else m) for m in modes]


def _check_model(url: str, model: str, protocol: str, variants: list[Variant]) -> ModelIO:
    """The Triton model takes the per-request inputs the curves send (a deployment made before
    they existed does not); the server answers at all. Returns whether the model is batch-first
    (max_batch_size > 0: tensorrtllm_backend's text models, which then get [1, 1] requests),
    which of the outputs the load generator reads it has, and whether it takes return_perf_metrics."""

    import json
    import urllib.request

    try:
        if protocol == "http":
            with urllib.request.urlopen(f"http://{url}/v2/models/{model}", timeout=10) as r:
                meta = json.loads(r.read())
                inputs, outputs = {i["name"] for i in meta["inputs"]}, {o["name"] for o in meta["outputs"]}
            with urllib.request.urlopen(f"http://{url}/v2/models/{model}/config", timeout=10) as r:
                batched = json.loads(r.read()).get("max_batch_size", 0) > 0
        else:
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(url) as client:
                meta = client.get_model_metadata(model)
                inputs, outputs = {i.name for i in meta.inputs}, {o.name for o in meta.outputs}
                batched = client.get_model_config(model).config.max_batch_size > 0
    except Exception as e:  # noqa: BLE001 - any transport or protocol failure is the same one line
        raise UserError(f"--url {url}: no Triton server serves model {model!r} there "
                        f"({str(e).splitlines()[0][:200]})") \
            from None
    missing = [k for k in sorted({k for v in variants for k in v.settings()}) if k not in inputs]
    if missing:
        raise UserError(f"--url {url}: model {model!r} has no {', '.join(missing)} input (deployed before per-request "
                        f"{'/'.join(missing)}): deploy it again (trtllm-dflash run RECIPE --force deploy)")
    if "text_input" not in inputs:
        raise UserError(f"--model {model}: it takes no text_input (a token-id model); sweep drives text models "
                        "(dflash, ensemble, tensorrt_llm_bls)")
    return ModelIO(batched, tuple(n for n in OUTPUTS if n in outputs), "return_perf_metrics" in inputs)


def server_acceptance(recipe: Recipe, url: str, protocol: str, from_dir: Path | None):
    """Where a TensorRT-LLM deployment's per-request acceptance is read (pytorch backend, swept over
    trtllm-serve), by its version (recipe/trtllm_api.py acceptance_source): the per-request metrics
    JSONL or TensorRT-LLM's acceptance histograms, which deploy points under
    DEPLOY_DIR/trtllm_serve/ (sweep/trtllm_acceptance.py). None where the responses carry it (our
    own servers, PR #19311's releases) and where the files' directory is unknown (no --from)."""
    from trtllm_dflash.deploy.llmapi import ACCEPT_STATS_DIR, PERF_METRICS_DIR
    from trtllm_dflash.deploy.repository import TRTLLM_SERVE
    from trtllm_dflash.recipe.trtllm_api import acceptance_source
    from trtllm_dflash.sweep.trtllm_acceptance import ServerAcceptance

    if recipe.backend.name != "pytorch" or protocol != "openai" or from_dir is None:
        return None
    source = acceptance_source(recipe.backend.trtllm_version or backend_spec("pytorch").default_trtllm_version)
    if source == "speculative_decoding":
        return None
    sub = PERF_METRICS_DIR if source == "perf_metrics_jsonl" else ACCEPT_STATS_DIR
    return ServerAcceptance(source, Path(from_dir) / TRTLLM_SERVE / sub)


def metrics_url_for(recipe: Recipe, url: str, protocol: str) -> str:
    """Where the server at `url` exports its speculative-decoding counters (serve/metrics.py): the
    OpenAI server on its own /metrics, Triton on the recipe's serve.metrics_port of the same host."""
    from trtllm_dflash.sweep.protocols import openai_base

    if protocol == "openai":
        return f"{openai_base(url)}/metrics"
    host = url.split("://")[-1].rsplit(":", 1)[0]
    return f"http://{host}:{recipe.serve.metrics_port}/metrics"


def sweep(recipe: Recipe, url: str, out: Path, *, levels: list[int] | None = None, protocol: str = "grpc",
          temperature: float = 0.0, from_dir: Path | None = None, model: str | None = None,
          note: dict | None = None, modes: list[str] | None = None, tune: list[int] | None = None,
          repeats: int = 1, metrics_url: str | None = None) -> SweepResult:
    """Run the load generator against `url` and write OUT (replacing an earlier sweep of this recipe).
    protocol: "grpc" / "http" (Triton, the dflash model) or "openai" (/v1/completions of any
    OpenAI-compatible server; the model id is `model`, else the recipe's serve.model_name when the
    server lists it, else the server's only model). modes / tune: the curves (`sweep_variants`);
    repeats: each level of each curve that many times, interleaved, the median repeat reported.
    `note`: more facts about the server for the manifest (e.g. which runners served it).
    metrics_url: the server's Prometheus /metrics (default `metrics_url_for`), whose counters give
    each level's server-side tau beside the client's."""
    sw = recipe.sweep
    levels = levels or sw.concurrency
    if repeats < 1:
        raise UserError(f"--repeats: {repeats}, expected >= 1")
    name = model or recipe.serve.model_name
    io = ModelIO(dynamo=protocol == "openai" and is_dynamo(url))
    variants = sweep_variants(recipe, modes, protocol, tune, io.dynamo)
    if protocol == "openai":
        name = openai_model(url, name) if model is None else name
    else:
        io = _check_model(url, name, protocol, variants)
    prompts = load_prompts(sw.dataset, max(sw.requests_at(c) for c in levels) + sw.warmup_requests, sw.input_len,
                           sw.seed)
    metrics_url = metrics_url or metrics_url_for(recipe, url, protocol)
    server = server_acceptance(recipe, url, protocol, from_dir)
    manifest = Manifest.for_stage("sweep", recipe, from_dir, extra={
        "server_acceptance": server.source if server else ENGINE_DATA if io.dynamo else None,
        "url": url, "protocol": protocol, "metrics_url": metrics_url, "levels": levels, "temperature": temperature,
        "model": name,
        "curves": [v.name for v in variants], "repeats": repeats, **(note or {})})
    gpus = 1 if recipe.gpu.is_cpu else recipe.world_size
    title = f"{recipe.name} ({recipe.hardware.count}x {recipe.hardware.gpu}, {recipe.backend.name})"
    with atomic_stage_dir(out, manifest, overwrite=True) as tmp:
        result = run_sweep(url, name, levels, sw.requests_at, sw.warmup_requests, prompts, sw.output_lens(len(prompts)),
                           gpus=gpus, seed=sw.seed, temperature=temperature, protocol=protocol, variants=variants,
                           repeats=repeats, metrics_url=metrics_url, io=io, server=server)
        tuned = None
        if tune is not None:
            from trtllm_dflash.sweep.tune import tune_summary, write_snippet

            tuned = tune_summary(result.repeats, variants, levels)
            write_snippet(tmp / "draft_len.yaml", tuned, recipe)
        result.summary = files.write(tmp, result.levels, result.records, title, tune=tuned)
        manifest.extra["failed"] = result.failed
    result.out_dir = Path(out)
    return result


def read_summary(out: Path, curve: str | None = None) -> list[LevelSummary]:
    """The level rows of a finished sweep directory: every curve's, or one curve's."""
    curves = files.read_curves(out)
    if curve is None:
        return [row for rows in curves.values() for row in rows]
    if curve not in curves:
        raise UserError(f"{out}: the sweep has no {curve!r} curve (it has {', '.join(curves)})")
    return curves[curve]
