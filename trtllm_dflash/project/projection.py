"""Projected curves of a recipe: AR, DFlash at each draft length, the recipe's draft-length bands
and the best draft length per concurrency, each as sweep rows (sweep/metrics.py LevelSummary),
with the headline ratios of sweep/fronts.py.

Workload: the recipe's sweep section. Each level c runs c sequences of `input_len` prompt tokens
and `output_len` output tokens; the step time is taken at the mean running context
ctx = input_len + output_len / 2. Levels beyond build.max_batch_size or beyond the memory plan's
largest concurrency (recipe/plan/planner.py) are left out and listed in `skipped`.

A projected row reads like a measured one (stepmodel.py, "Metrics"; costs.py StepCost):
tokens/s/user = tau / T (= 1 / TPOT), TPOT = T / tau, inter-chunk latency = T (one chunk per step), TTFT, E2E, and
output tokens/s per GPU = c * output_len / E2E / GPUs. Distributions of a projection are single values
(n = 0: no requests were measured).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from trtllm_dflash.errors import UserError
from trtllm_dflash.project.acceptance import AcceptanceProfile
from trtllm_dflash.project.costs import StepCost
from trtllm_dflash.project.rates import Assumptions
from trtllm_dflash.project.stepmodel import Deployment, StepModel
from trtllm_dflash.recipe.plan.engine_layout import verify_cost
from trtllm_dflash.recipe.plan.placement import scale_out
from trtllm_dflash.recipe.plan.planner import plan, smallest_tp
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.sweep.fronts import Comparison, Curve, compare
from trtllm_dflash.sweep.metrics import Distribution, LevelSummary, curve_of
from trtllm_dflash.sweep.tune import best_bands

AR = "AR"
BANDS = "DFlash (recipe bands)"
BEST = "DFlash (best draft length)"
DEFAULT_BANDS = ((500.0, 600.0),)  # tokens/s/user: NVIDIA's "N x the throughput at 500-600 tok/s/user"


def dflash_name(k: int) -> str:
    return f"DFlash K={k}"


def _point(v: float) -> Distribution:
    return Distribution(n=0, mean=v, p50=v, p90=v, p99=v, min=v, max=v)


def level_row(s: StepCost, gpus: int) -> LevelSummary:
    """A projected step as a sweep row."""
    T = s.seconds
    tpot = T / s.tau
    return LevelSummary(
        concurrency=s.concurrency, requests=0, failed=0, wall_s=0.0, output_tokens=0,
        output_tok_s=s.tok_s_gpu(1), output_tok_s_per_gpu=s.tok_s_gpu(gpus),
        tau=s.tau, ttft_s=_point(s.ttft), tpot_s=_point(tpot), tok_s_user=_point(1 / tpot),
        inter_chunk_s=_point(T), e2e_s=_point(s.e2e),
    )


@dataclass
class Projection:
    recipe: str
    device: str
    gpus: int
    tp: int
    input_len: int
    output_len: int
    context: int
    assumptions: Assumptions
    rates_source: str
    acceptance: AcceptanceProfile
    levels: list[int]
    skipped: dict[int, str]
    curves: dict[str, list[LevelSummary]]
    draft_lens: dict[str, list[int]]  # curve -> draft length used at each level
    steps: dict[str, list[dict]]  # curve -> per-level breakdown (bytes, FLOPs, ms per part)
    suggested_bands: list[dict]
    verify: str  # what a verify round costs the target (engine_layout.verify_cost)
    layout: str  # how the GPUs serve: replicas and tp, and why (recipe/plan/placement.py scale_out)
    router: str = ""  # how requests reach the replicas, as the projection assumes (router_line)
    comparisons: dict[str, Comparison] = field(default_factory=dict)

    def curve(self, name: str) -> Curve:
        return curve_of(name, self.curves[name])

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe, "device": self.device, "gpus": self.gpus, "tp": self.tp,
            "workload": {"input_len": self.input_len, "output_len": self.output_len, "mean_context": self.context},
            "assumptions": self.assumptions.to_json(), "rates": self.rates_source,
            "acceptance": self.acceptance.to_json(), "levels": self.levels,
            "skipped_levels": {str(k): v for k, v in self.skipped.items()},
            "curves": {name: [asdict(r) for r in rows] for name, rows in self.curves.items()},
            "draft_lens": self.draft_lens, "steps": self.steps, "suggested_bands": self.suggested_bands,
            "verify": self.verify, "layout": self.layout, "router": self.router,
            "headline": {name: c.to_json() for name, c in self.comparisons.items()},
        }


def layout_line(recipe: Recipe) -> str:
    """How the recipe's GPUs serve and why (recipe/plan/placement.py scale_out); '' on cpu."""
    if recipe.gpu.is_cpu:
        return ""
    return "layout: " + scale_out(recipe, smallest_tp(recipe, recipe.gpu).tp)


def router_line(recipe: Recipe) -> str:
    """Which router the replica split assumes: an even split (`per_replica`), what Dynamo's
    round-robin router does and what `serve --api dynamo` writes unless the KV router applies
    (recipe/dynamo.py router); '' on cpu."""
    from trtllm_dflash.recipe import dynamo
    from trtllm_dflash.recipe.support import backend as backend_spec

    n = recipe.parallel.replicas
    if recipe.gpu.is_cpu:
        return ""
    if n == 1:
        return "router: one replica, no routing: every request of the endpoint runs on it"
    line = (f"router: an even split, ceil(c / {n}) requests on the busiest of {n} replicas, as a round-robin router "
            "spreads them (NVIDIA Dynamo's frontend default, or a Kubernetes Service over the copies)")
    if backend_spec(recipe.backend.name).triton_model != "llmapi":
        return line
    mode, _ = dynamo.router(recipe)
    if mode == "kv":
        return line + ("; `serve --api dynamo` writes the KV router for this recipe (prefix reuse on), which routes "
                       "by cache overlap: not modelled, the even split is assumed")
    return line + f"; `serve --api dynamo` writes {mode} for this recipe"


def per_replica(concurrency: int, replicas: int) -> int:
    """The requests in flight on the busiest of `replicas` data-parallel copies behind one endpoint."""
    return -(-concurrency // replicas)


def feasible_levels(recipe: Recipe, levels: list[int]) -> tuple[list[int], dict[int, str]]:
    """The levels the deployment can hold (max_batch_size, memory plan), and why others cannot."""
    p, replicas = plan(recipe), recipe.parallel.replicas
    keep, skipped = [], {}
    for c in sorted(set(levels)):
        each = f" over {replicas} replicas" if replicas > 1 else ""
        if per_replica(c, replicas) > recipe.build.max_batch_size:
            skipped[c] = f"above build.max_batch_size {recipe.build.max_batch_size}{each}"
        elif per_replica(c, replicas) > p.max_concurrency:
            skipped[c] = f"the memory plan holds at most {p.max_concurrency} sequences of build.max_seq_len"
        else:
            keep.append(c)
    if not keep:
        raise UserError(f"{recipe.name}: no concurrency level to project: " +
                        "; ".join(f"{c}: {why}" for c, why in skipped.items()))
    return keep, skipped


def project(recipe: Recipe, profile: AcceptanceProfile, assumptions: Assumptions = Assumptions(),
            levels: list[int] | None = None, bands: tuple[tuple[float, float], ...] = DEFAULT_BANDS,
            model: StepModel | None = None) -> Projection:
    """Every curve of the module docstring for `recipe` with acceptance `profile`."""
    model = model or StepModel(Deployment.from_recipe(recipe), assumptions)
    dep = model.dep
    sw = recipe.sweep
    isl, osl = sw.input_len, sw.output_len
    ctx = isl + osl // 2
    levels, skipped = feasible_levels(recipe, levels or sw.concurrency)
    k_max = min(recipe.speculative.block_size - 1, profile.max_draft_len)
    replicas = recipe.parallel.replicas
    gpus = dep.gpus * replicas

    def step(c: int, k: int, plain: bool = True) -> StepCost:
        """A step of the busiest replica at endpoint concurrency c, counted for all c requests."""
        s = model.step(per_replica(c, replicas), k, profile.tau(k) if k else 1.0, ctx, isl, osl, plain=plain)
        return replace(s, concurrency=c)

    grid = {k: [step(c, k) for c in levels] for k in range(k_max + 1)}
    curves: dict[str, list[LevelSummary]] = {}
    used: dict[str, list[int]] = {}
    steps: dict[str, list[dict]] = {}

    def add(name: str, chosen: list[StepCost]) -> None:
        curves[name] = [level_row(s, gpus) for s in chosen]
        used[name] = [s.draft_len for s in chosen]
        steps[name] = [{"concurrency": s.concurrency, "draft_len": s.draft_len, "tau": s.tau, **s.breakdown_ms()}
                       for s in chosen]

    add(AR, grid[0])
    for k in range(1, k_max + 1):
        add(dflash_name(k), grid[k])
    best = [max((grid[k][i] for k in range(1, k_max + 1)), key=lambda s: s.tok_s_user) for i in range(len(levels))]
    # Speculation off (0) on the DFlash server: the AR step, except where verify recomputes its sequence.
    off = grid[0] if not dep.verify_recomputes else [step(c, 0, plain=False) for c in levels]
    # What a deployment should set per level: speculation off where it is faster than every draft length.
    best_or_off = [max(o, s, key=lambda s: s.tok_s_user) for o, s in zip(off, best)]
    if recipe.speculative.auto:  # `auto` is modelled by what it aims for: the best length per level, 0 included
        add(BANDS, best_or_off)
    else:
        ks = [min(recipe.speculative.draft_len_at(per_replica(c, replicas)), k_max) for c in levels]  # each server's
        add(BANDS, [grid[k][i] if k else off[i] for i, k in enumerate(ks)])
    add(BEST, best)

    suggested = best_bands({c: s.draft_len for c, s in zip(levels, best_or_off)})

    proj = Projection(
        recipe=recipe.name, device=f"{recipe.hardware.count}x {recipe.hardware.gpu}", gpus=gpus, tp=dep.tp,
        input_len=isl, output_len=osl, context=ctx, assumptions=model.a, rates_source=model.rates.source,
        acceptance=profile, levels=levels, skipped=skipped, curves=curves, draft_lens=used, steps=steps,
        suggested_bands=suggested, verify=verify_cost(recipe).describe(), layout=layout_line(recipe),
        router=router_line(recipe),
    )
    proj.comparisons = _comparisons(proj, k_max, bands)
    return proj


def _comparisons(proj: Projection, k_max: int, bands) -> dict[str, Comparison]:
    """The headline ratios of the DFlash curves against AR."""
    ar = proj.curve(AR)
    # Every DFlash point of every draft length: the front NVIDIA's plots take over configurations.
    all_dfl = Curve("DFlash (all draft lengths)",
                    [p for k in range(1, k_max + 1) for p in proj.curve(dflash_name(k)).points])
    return {
        "bands_vs_ar": compare(proj.curve(BANDS), ar, bands),
        "best_vs_ar": compare(proj.curve(BEST), ar, bands),
        "all_draft_lens_vs_ar": compare(all_dfl, ar, bands),
    }
