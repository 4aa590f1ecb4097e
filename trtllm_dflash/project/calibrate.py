"""Calibration of the step model on this machine (the cpu "GPU" has no catalog bandwidth or peak).

Passes (reference backend, in this process, the threads the server uses): greedy AR and DFlash
decodes of held-out prompts at batch 1 and 4; every round's StepRecord times the target pass
(t_verify: a 1-token step in AR, a block verify in DFlash) and the drafter pass (t_draft). The
step model writes each pass as

    t = (weight + KV bytes) / BW + (GEMM + attention FLOPs) / P + (layers + 1) * t_layer

with the bytes, FLOPs and layers of that pass (stepmodel.py). BW [B/s] is measured directly: a
read of a buffer the size of the target's weights, as the passes read them (so the caches the
model enjoys count). P [FLOP/s] and t_layer [s] are then a least-squares fit over the median
times of the six pass kinds (AR step, verify and drafter pass at two batch sizes: the FLOPs span
60x, so the two separate), each weighted by 1/t so that every pass counts by its relative error.
Every time is the median over interleaved repeats spread over the calibration: the machine as a
sweep finds it (a sweep reports medians, and on a shared machine its neighbours run too).

Serving (optional, a running server of the recipe at `url`): short probes at concurrency 3 and 6
(PROBE_LEVELS: levels a sweep of 1, 2, 4, 8 does not run, so that every level it compares is a
prediction) with the sweep's load generator and prompts of another seed than the sweep's. A request's round
time is (end - first chunk) / rounds; a level's is the median over its requests (as a sweep
reports). Subtracting the calibrated passes and the prompt-pass share leaves t_step (per forward
pass) and t_seq (per sequence in flight):

    round(c) - passes(c) - prefill share(c) = 2 * t_step + c * t_seq      (c = 3, 6)
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace

from trtllm_dflash.errors import UserError
from trtllm_dflash.project.rates import Assumptions
from trtllm_dflash.project.stepmodel import Deployment, StepModel
from trtllm_dflash.recipe.hardware import Measured, cpu_torch_threads

BATCHES = (1, 4)


@dataclass
class Calibration:
    measured: Measured
    passes: dict  # pass kind -> seconds (median), and the fit's inputs
    serving: dict | None = None

    def to_json(self) -> dict:
        return {"measured": self.measured.model_dump(), "passes": self.passes, "serving": self.serving}


def _unit_model(recipe) -> StepModel:
    """A model whose rates are 1 B/s and 1 FLOP/s: its pass costs are the raw bytes and FLOPs."""
    unit = Measured(source="calibration (unit rates)", memory_bandwidth_gbs=1e-9, tensor_gflops=1e-9,
                    layer_overhead_us=0.0, step_overhead_ms=0.0, seq_overhead_us=0.0)
    dep = Deployment.from_recipe(recipe)
    return StepModel(replace(dep, gpu=dep.gpu.model_copy(update={"measured": unit})), Assumptions())


def _features(cost, layers: int) -> list[float]:
    return [cost.weight_bytes + cost.kv_bytes, cost.gemm_flops + cost.attention_flops, float(layers)]


def measure_passes(recipe, prompts: int = 4, prompt_len: int = 64, new_tokens: int = 48, repeats: int = 3) -> dict:
    """The median time of every pass kind over `repeats` interleaved decodes (the machine as a sweep
    finds it: a sweep reports medians too), and the (context, tau) they ran at."""
    import torch

    from trtllm_dflash.prompts.sources import heldout_token_prompts
    from trtllm_dflash.reference import generate_steps, load_pair

    tdir, ddir = recipe.target.path, recipe.drafter.path
    if tdir is None or ddir is None:
        raise UserError(f"{recipe.name}: calibration runs the reference backend on local checkpoints")
    torch.set_num_threads(cpu_torch_threads(recipe.parallel.tp))  # as the server does
    target, drafter = load_pair(tdir, ddir, torch.float32)
    ps = heldout_token_prompts(tdir, max(prompts, max(BATCHES)), prompt_len)
    if ps is None:
        g = torch.Generator().manual_seed(0)
        ps = [torch.randint(0, target.cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    block = recipe.speculative.block_size
    out: dict = {}
    buf = torch.ones(int(_unit_model(recipe).target_pass(1, 1, 0).weight_bytes) // 4)
    reads: list[float] = []

    def read(times: int = 10) -> None:
        for _ in range(times):
            t0 = time.perf_counter()
            buf.sum()
            reads.append(time.perf_counter() - t0)

    for _ in generate_steps(target, drafter, ps[:1], 8, mode="dflash", block_size=block, stop_token_ids=[]):
        pass  # warm-up
    samples: dict[str, list[float]] = {}
    taus: dict[int, tuple[int, int]] = {}
    for _ in range(repeats):
        read()
        for mode in ("ar", "dflash"):
            for b in BATCHES:
                for rec in generate_steps(target, drafter, ps[:b], new_tokens, mode=mode, block_size=block,
                                          stop_token_ids=[]):
                    if rec.round == 0 or any(d is not None for d in rec.finished) or len(rec.seq_ids) != b:
                        continue
                    if mode == "dflash" and any(d != block - 1 for d in rec.drafted):
                        continue
                    samples.setdefault(f"{mode}_target_b{b}", []).append(rec.t_verify)
                    if mode == "dflash":
                        samples.setdefault(f"dflash_drafter_b{b}", []).append(rec.t_draft)
                        c, n = taus.get(b, (0, 0))
                        taus[b] = (c + sum(len(t) for t in rec.tokens), n + len(rec.tokens))
    for mode in ("ar", "dflash"):
        for b in BATCHES:
            if not samples.get(f"{mode}_target_b{b}"):
                raise UserError(f"calibration: no full {mode} round at batch {b}; raise new_tokens")
    read()
    out["read_bytes"], out["read_s"] = buf.numel() * 4, statistics.median(reads)
    out.update({k: statistics.median(v) for k, v in samples.items()})
    out.update({f"tau_b{b}": c / n for b, (c, n) in taus.items()})
    out["context"] = prompt_len + new_tokens // 2
    out["block_size"] = block
    return out


def fit_passes(recipe, timings: dict) -> dict:
    """BW from the buffer read; P and t_layer by weighted least squares over the passes' median times."""
    import numpy as np

    m = _unit_model(recipe)
    bw = timings["read_bytes"] / timings["read_s"]
    ctx, k = timings["context"], timings["block_size"] - 1
    rows, ts = [], []
    for b in BATCHES:
        rows.append(_features(m.target_pass(b, 1, ctx), m.dep.target.num_layers + 1))
        ts.append(timings[f"ar_target_b{b}"])
        rows.append(_features(m.target_pass(b, k + 1, ctx), m.dep.target.num_layers + 1))
        ts.append(timings[f"dflash_target_b{b}"])
        rows.append(_features(m.drafter_pass(b, k, ctx, timings[f"tau_b{b}"]), m.dep.drafter.num_layers + 1))
        ts.append(timings[f"dflash_drafter_b{b}"])
    a, t = np.array(rows), np.array(ts)
    rest = t - a[:, 0] / bw  # what the memory traffic leaves to the math and the layers
    x, *_ = np.linalg.lstsq(a[:, 1:] / t[:, None], rest / t, rcond=None)
    if x[0] <= 0:
        raise UserError(f"calibration: the pass timings do not grow with their FLOPs (fit {x.tolist()}); the "
                        "machine was probably busy, try again")
    x[1] = max(0.0, x[1])
    pred = a[:, 0] / bw + a[:, 1:] @ x
    return {"memory_bandwidth_gbs": bw / 1e9, "tensor_gflops": 1 / x[0] / 1e9, "layer_overhead_us": x[1] * 1e6,
            "fit_relative_errors": [float(e) for e in pred / t - 1]}


PROBE_LEVELS = (3, 6)  # not levels the CPU projection test compares (1, 2, 4, 8)


def measure_serving(recipe, url: str, passes: Measured, levels: tuple[int, int] = PROBE_LEVELS,
                    waves: int = 5, protocol: str = "grpc") -> dict:
    """Round times of a running server at two concurrencies (`waves` x c requests each, at least 8,
    after 2 warm-up requests), and the t_step / t_seq they imply. The first c requests of a level
    start together and share one batched prompt pass; a sweep's requests soon arrive one by one,
    each with its own prompt pass (what the model's prefill share counts), so only requests after
    the first c are timed."""
    import asyncio

    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.sweep.loadgen import run_level

    sw = recipe.sweep
    counts = {c: max(8, waves * c) for c in levels}
    prompts = load_prompts(sw.dataset, sum(counts.values()) + 4, sw.input_len, sw.seed + 1000)
    dep = Deployment.from_recipe(recipe)
    model = StepModel(replace(dep, gpu=dep.gpu.model_copy(update={"measured": passes.model_copy(
        update={"step_overhead_ms": 0.0, "seq_overhead_us": 0.0})})), Assumptions())
    k = recipe.speculative.block_size - 1
    def probe(c, n, warmup):
        return asyncio.run(run_level(
            url, recipe.serve.model_name, prompts, c, n, warmup, sw.output_len, sw.seed + 1000, 0.0, protocol=protocol))
    probe(1, 0, 2)  # a fresh server's first requests are slow
    found = {}
    for c, n in counts.items():
        ok = [r for r in probe(c, n, 0) if r.ok and r.rounds > 0 and len(r.chunk_ns) > 1 and r.request_id >= c]
        if not ok:
            raise UserError(f"calibration: no request at concurrency {c} streamed more than one chunk from {url}")
        rounds = [(r.end_ns - r.chunk_ns[0]) * 1e-9 / r.rounds for r in ok]
        tau = sum(r.output_tokens - 1 for r in ok) / sum(r.rounds for r in ok)
        modelled = model.step(c, k, tau, sw.input_len + sw.output_len // 2, sw.input_len, sw.output_len).seconds
        found[c] = {"requests": len(ok), "round_s": statistics.median(rounds), "tau": tau,
                    "modelled_without_overhead_s": modelled}
    (c1, l1), (c2, l2) = sorted(found.items())
    r1, r2 = l1["round_s"] - l1["modelled_without_overhead_s"], l2["round_s"] - l2["modelled_without_overhead_s"]
    seq = max(0.0, (r2 - r1) / (c2 - c1))
    step = max(0.0, (r1 - c1 * seq) / 2)
    return {"levels": {str(c): v for c, v in found.items()}, "step_overhead_ms": step * 1e3,
            "seq_overhead_us": seq * 1e6}


def calibrate(recipe, url: str | None = None, protocol: str = "grpc") -> Calibration:
    """Pass rates always; serving overheads when a server of the recipe runs at `url`."""
    load = {"loadavg_before": os.getloadavg()[0]}  # wall-clock numbers: say how busy the machine was
    timings = measure_passes(recipe)
    fit = fit_passes(recipe, timings)
    base = recipe.gpu.measured
    measured = Measured(
        source=f"trtllm-dflash project --calibrate on this machine ({recipe.name}, reference backend, fp32)",
        memory_bandwidth_gbs=fit["memory_bandwidth_gbs"], tensor_gflops=fit["tensor_gflops"],
        layer_overhead_us=fit["layer_overhead_us"],
        step_overhead_ms=base.step_overhead_ms if base else None, seq_overhead_us=base.seq_overhead_us if base
        else None,
    )
    serving = None
    if url is not None:
        serving = measure_serving(recipe, url, measured, protocol=protocol)
        measured = measured.model_copy(update={"step_overhead_ms": serving["step_overhead_ms"],
                                               "seq_overhead_us": serving["seq_overhead_us"],
                                               "source": measured.source + f", serving overhead probed at {url}"})
    load["loadavg_after"] = os.getloadavg()[0]
    return Calibration(measured, {**timings, **fit, **load}, serving)
