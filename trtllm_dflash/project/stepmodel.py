"""Step-time model: how long one decoding step of a recipe takes on its hardware.

Everything below is per GPU of the tensor-parallel group (tp ranks split every weight matrix,
every KV head and every GEMM evenly), for `c` sequences in flight whose running context
(prompt + tokens generated so far) is `ctx` tokens. Units: bytes [B], FLOP, seconds [s].

Steps
-----
    AR step       T_ar(c)    = target pass over c tokens (1 per sequence)
                               + t_step + c * t_seq + prefill share
    DFlash round  T_dfl(c,K) = drafter pass (K+1 slots per sequence, LM head on K of them)
                               + target verify pass over c * (K+1) tokens
                               + 2 * t_step + c * t_seq + t_loop + c * t_req + prefill share
                  where verify recomputes its sequence (the engine backend without KV block
                  reuse: recipe/plan/engine_layout.py verify_cost), the verify pass runs c * (ctx + K+1)
                  tokens over an empty cache instead: a prefill of the whole sequence, logits at
                  its last K+1 positions; and where the Executor charges each verify request its
                  whole sequence (the engine backend: recipe/plan/engine_layout.py STEP_RULE), the c
                  sequences verify in S = ceil(c / (max_num_tokens // (ctx + K+1))) Executor steps,
                  each a pass of its own (weights read again, one more t_step)
    t_step is the fixed launch/scheduling cost of one forward pass (a DFlash round launches two:
    the drafter's and the verify), t_seq the runtime's cost of one sequence in flight per step;
    a round of the DFlash server also pays t_loop + c * t_req, our serving loop's own host time,
    fixed and per request in flight, as `bench loop` measured it (rates.py LOOP_COST), where our
    loop decodes (the reference and engine backends; TensorRT-LLM's native DFlash runs its own).
    prefill share = c * t_prefill(ISL) / (steps per request),  steps per request = (OSL - 1) / tau
                    (every request's prompt pass, t_step included, is paid by the steps of the
                    requests in flight)

A pass over n tokens (q tokens per sequence, n = c * q)
-------------------------------------------------------
    weight bytes    W = L * (attention params + MLP params touched) * bytes(weight format) / tp
                        + vocab * hidden * bytes(checkpoint dtype) / tp           (LM head, read once)
                        MLP params touched, MoE: router + E * (1 - (1 - k/E)^n) experts per layer
                        (expected distinct experts under uniform top-k routing: an upper bound)
    GEMM FLOPs      F = 2 * n * L * (attention + k active experts' or the dense MLP's params) / tp
                        + 2 * n_logits * vocab * hidden / tp
    KV bytes        A = c * KV bytes of a sequence of ctx + q tokens on one rank
                        (recipe/plan/rows.py target_kv_bytes_per_seq: K and V, kv-cache format,
                        sliding-window layers capped at window + q tokens)
    attention FLOPs   = 4 * n * visible ctx * heads * head_dim * L / tp           (QK^T and PV)
    all-reduce        = 2 per layer * (t_ar + 2 (tp - 1) / tp * n * hidden * 2 B / (B_link * e_link))
                        (ring all-reduce of BF16 activations; B_link = one direction of NVLink)
                        tp over m NVLink domains of g GPUs (tp = g * m, e.g. two 8-GPU nodes): a
                        hierarchical all-reduce, the NVLink ring inside each domain plus each GPU's
                        1/g shard all-reduced across the domains over the fabric,
                        2 per layer * (t_ar + 2 (g - 1) / g * S / (B_link * e_link)
                                       + t_fab + 2 (m - 1) / m * (S / g) / (B_fab * e_fab)),
                        S = n * hidden * 2 B, B_fab = the inter-node fabric per GPU (catalog fabric_gbs)

    t_pass = W / (B_hbm * e_hbm) + F / (P_fmt * e_tensor)                          weights and GEMMs
           + A / (B_hbm * e_att) + attention FLOPs / (P_bf16 * e_att)              attention kernel
           + all-reduces + (L + 1) * t_layer                                       communication, launches
    (the embedding or the drafter's context fusion, and the final norm and LM head, launch about
    one more layer's worth of kernels: hence L + 1)

Memory traffic and tensor math are ADDED, not overlapped (max): at decode sizes a GEMM does not
hide its weight stream behind its math, and between the two limits the sum is the better
estimate (an upper bound of the roofline's max, equal to it far from the ridge point).

The drafter pass is the same formula over the drafter: its linear params (fusion `fc` included)
at the drafter format, K+1 query slots per sequence through its layers, the new context of tau
tokens per sequence through `fc` and every layer's K/V projections, its context cache
(planner.drafter_ctx_bytes_per_seq, the cache format the backend keeps), and the target's LM head
on the K draft slots. It is split over the ranks recipe/plan/drafter.py drafter_placement gives it: tp
(like the target, with its all-reduces), or 1 where rank 0 holds the whole drafter (engine backend).

Rates: B_hbm, P_fmt from the hardware catalog (recipe/catalog/hardware.yaml) times the assumed
efficiencies (rates.py Assumptions), or the catalog entry's `measured` rates (used as they are,
efficiency 1); P_fmt is the dense rate of the GEMM input format: the activation format for the
target (fp8 -> FP8, nvfp4 -> FP4, bf16 -> BF16), the weight format for a quantized drafter, BF16
for attention and the LM head. Metrics, as a sweep measures them (sweep/metrics.py; costs.py):

    tokens/s/user = tau / T                                  (= 1 / TPOT)
    TTFT          = t_prefill(ISL) + T (c > 1: a new request waits for the step in progress)
    E2E           = TTFT + (OSL - 1) * T / tau
    tokens/s/GPU  = c * OSL / E2E / GPUs                     (closed loop: c request slots)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trtllm_dflash.errors import UserError
from trtllm_dflash.project.costs import ZERO, PassCost, StepCost
from trtllm_dflash.project.rates import Assumptions, rates_for
from trtllm_dflash.recipe.hardware import BYTES_PER_ELEMENT, GpuSpec
from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.plan.drafter import drafter_placement
from trtllm_dflash.recipe.plan.engine_layout import step_sizes, verify_cost
from trtllm_dflash.recipe.plan.rows import context_cache_format, drafter_ctx_bytes_per_seq, target_kv_bytes_per_seq
from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import backend

ACT_BYTES = 2.0  # bytes per activation element all-reduced between tp ranks (BF16)


def _compute_format(fmt: str, fallback: str) -> str:
    """Quantized formats compute in themselves (W8A8 / W4A4); float weights in `fallback`."""
    return fmt if fmt in ("fp8", "nvfp4", "mxfp4") else fallback


@dataclass(frozen=True)
class Deployment:
    """The facts of one recipe the model reads (so tests can build one without a recipe file)."""

    name: str
    gpu: GpuSpec
    tp: int
    gpus: int  # GPUs the throughput is divided by (tokens/s/GPU); 1 on cpu
    target: ArchFacts
    drafter: ArchFacts
    weight_format: str  # target linear layers
    gemm_format: str  # target GEMM inputs
    head_format: str  # embedding / LM head (the checkpoint's high-precision dtype)
    kv_format: str
    drafter_format: str
    drafter_gemm_format: str
    ctx_format: str  # the drafter's context cache
    block_size: int
    # ranks the drafter is split over (recipe/plan/drafter.py drafter_placement); None = tp
    drafter_tp: int | None = None
    # a verify round re-prefills its sequence (recipe/plan/engine_layout.py verify_cost)
    verify_recomputes: bool = False
    # The Executor's step budget where each verify request is charged its whole sequence (the engine
    # backend: recipe/plan/engine_layout.py STEP_RULE); None where a round is one pass.
    verify_max_num_tokens: int | None = None
    verify_max_batch_size: int = 1
    round_loop: bool = True  # our serving loop decodes (recipe/support.py Backend.round_loop): its host time is paid

    @classmethod
    def from_recipe(cls, r: Recipe) -> Deployment:
        q = r.quantization
        head = q.checkpoint_dtype("target")
        if not r.gpu.is_cpu and head == "fp32":
            head = "bf16"
        return cls(
            name=r.name, gpu=r.gpu, tp=r.parallel.tp, gpus=1 if r.gpu.is_cpu else r.world_size,
            target=r.target_facts, drafter=r.drafter_facts, weight_format=q.target_weights,
            gemm_format=q.activations, head_format=head, kv_format=q.kv_cache, drafter_format=q.drafter,
            drafter_gemm_format=_compute_format(q.drafter, q.checkpoint_dtype("drafter")),
            ctx_format=context_cache_format(r), block_size=r.speculative.block_size,
            drafter_tp=drafter_placement(r).tp, verify_recomputes=verify_cost(r).recomputes,
            verify_max_num_tokens=verify_cost(r).max_num_tokens, verify_max_batch_size=r.build.max_batch_size,
            round_loop=backend(r.backend.name).round_loop,
        )


class StepModel:
    """The formulas of the module docstring for one deployment."""

    def __init__(self, dep: Deployment, assumptions: Assumptions = Assumptions()):
        self.dep, self.a = dep, assumptions
        self.rates = rates_for(dep.gpu, assumptions)
        if dep.tp > 1 and self.rates.link_bps is None:
            raise UserError(f"hardware.gpu {dep.gpu.name}: no interconnect bandwidth in the catalog to project "
                            f"parallel.tp={dep.tp}")
        if dep.tp > self.rates.domain and (self.rates.fabric_bps is None or self.rates.fabric_latency_s is None):
            raise UserError(f"hardware.gpu {dep.gpu.name}: parallel.tp={dep.tp} spans NVLink domains of "
                            f"{self.rates.domain} GPUs, and the catalog has no inter-node fabric (fabric_gbs, "
                            "fabric_latency_us) to project its all-reduces")

    # ---- pieces

    def _allreduce(self, layers: int, n: int, hidden: int, tp: int | None = None) -> float:
        tp, r = self.dep.tp if tp is None else tp, self.rates
        if tp == 1:
            return 0.0
        size = n * hidden * ACT_BYTES  # [B] of one all-reduce
        g = min(tp, r.domain)
        per = r.allreduce_latency_s + 2 * (g - 1) / g * size / r.link_bps
        if tp > g:  # the domains' shards over the fabric
            m = tp // g
            per += r.fabric_latency_s + 2 * (m - 1) / m * (size / g) / r.fabric_bps
        return 2 * layers * per

    def _attention(self, kv_bytes: float, flops: float) -> float:
        r = self.rates
        return kv_bytes / r.attention_bps + (flops / r.attention_flops if r.attention_flops else 0.0)

    def _head(self, n_logits: int, tp: int | None = None) -> tuple[float, float]:
        """(bytes, FLOPs) of the target's LM head over n_logits positions, on one of `tp` ranks."""
        t, tp = self.dep.target, self.dep.tp if tp is None else tp
        params = t.vocab_size * t.hidden_size
        return params * BYTES_PER_ELEMENT[self.dep.head_format] / tp, 2 * n_logits * params / tp

    def _cost(self, wbytes: float, kv: float, gemm: float, gemm_format: str, head_flops: float, att_flops: float,
              layers: int, n: int, hidden: int, tp: int | None = None) -> PassCost:
        """The times of a pass from what it moves and computes (module docstring, "A pass")."""
        r = self.rates
        return PassCost(
            weight_bytes=wbytes, kv_bytes=kv, gemm_flops=gemm + head_flops, attention_flops=att_flops,
            t_weights=wbytes / r.memory_bps,
            t_gemm=gemm / r.gemm_flops(gemm_format) + head_flops / r.gemm_flops(self.dep.head_format),
            t_attention=self._attention(kv, att_flops),
            t_allreduce=self._allreduce(layers, n, hidden, tp),
            t_layers=(layers + 1) * r.layer_s,
        )

    def target_pass(self, seqs: int, q: int, ctx: int, logits_per_seq: int | None = None) -> PassCost:
        """The target over `q` new tokens for each of `seqs` sequences whose cache holds `ctx` tokens."""
        d, t, tp = self.dep, self.dep.target, self.dep.tp
        n = seqs * q
        h = t.hidden_size
        attn = t.attention_params_per_layer
        if t.is_moe:
            expert = 3 * h * t.moe_intermediate_size
            distinct = t.num_experts * (1 - (1 - t.experts_per_token / t.num_experts) ** n)
            touched = attn + distinct * expert + h * t.num_experts
            active = attn + t.experts_per_token * expert + h * t.num_experts
        else:
            touched = active = attn + t.mlp_params_per_layer
        head_bytes, head_flops = self._head(seqs * (q if logits_per_seq is None else logits_per_seq))
        wbytes = t.num_layers * touched * BYTES_PER_ELEMENT[d.weight_format] / tp + head_bytes
        gemm = 2 * n * t.num_layers * active / tp
        kv = seqs * target_kv_bytes_per_seq(t, tp, ctx, q, BYTES_PER_ELEMENT[d.kv_format])
        full = t.num_layers - t.sliding_layers
        visible = full * (ctx + q) + t.sliding_layers * min(ctx + q, (t.sliding_window or 0) + q)
        att_flops = 4 * n * visible * t.num_attention_heads * t.head_dim / tp
        return self._cost(wbytes, kv, gemm, d.gemm_format, head_flops, att_flops, t.num_layers, n, h)

    def drafter_pass(self, seqs: int, draft_len: int, ctx: int, new_ctx: float) -> PassCost:
        """One DFlash drafter pass: K+1 slots per sequence, `new_ctx` newly committed tokens per
        sequence projected into its context cache, the target's LM head on the K draft slots."""
        d, f = self.dep, self.dep.drafter
        tp = d.tp if d.drafter_tp is None else d.drafter_tp  # 1: the whole drafter on rank 0's GPU
        q = draft_len + 1
        n = seqs * q
        h = f.hidden_size
        n_feat = len(f.target_layer_ids or [])
        per_layer = f.attention_params_per_layer + f.mlp_params_per_layer
        kv_proj = 2 * h * f.num_kv_heads * f.head_dim  # each layer's K/V projection of the context
        head_bytes, head_flops = self._head(seqs * draft_len, tp)
        wbytes = f.linear_params * BYTES_PER_ELEMENT[d.drafter_format] / tp + head_bytes
        gemm = (2 * n * f.num_layers * per_layer + 2 * seqs * new_ctx * (n_feat * h * h + f.num_layers * kv_proj)) / tp
        ctx_bytes = seqs * drafter_ctx_bytes_per_seq(f, tp, ctx, q, BYTES_PER_ELEMENT[d.ctx_format])
        att_flops = 4 * n * (ctx + q) * f.num_attention_heads * f.head_dim * f.num_layers / tp
        return self._cost(wbytes, ctx_bytes, gemm, d.drafter_gemm_format, head_flops, att_flops, f.num_layers, n, h, tp)

    def verify_steps(self, seqs: int, q: int, ctx: int) -> list[int]:
        """The sequences of each pass a verify round of `seqs` takes (one pass, except under STEP_RULE)."""
        d = self.dep
        if d.verify_max_num_tokens is None:
            return [seqs]
        return step_sizes(seqs, ctx + q, d.verify_max_num_tokens, d.verify_max_batch_size)

    def verify_pass(self, seqs: int, q: int, ctx: int) -> PassCost:
        """The target's verify of q = K+1 tokens per sequence: over the cached context, or over the
        whole sequence again where the deployment's verify recomputes it; summed over its steps."""
        total = ZERO
        for n in self.verify_steps(seqs, q, ctx):
            total = total + (self.target_pass(n, ctx + q, 0, logits_per_seq=q) if self.dep.verify_recomputes
                             else self.target_pass(n, q, ctx))
        return total

    def prefill(self, prompt_len: int) -> float:
        """Seconds of one request's prompt pass (logits at its last position only)."""
        return self.target_pass(1, prompt_len, 0, logits_per_seq=1).seconds

    # ---- steps

    def step(self, concurrency: int, draft_len: int, tau: float, ctx: int,
             prompt_len: int = 0, output_len: int = 0, *, plain: bool = True) -> StepCost:
        """One AR step (draft_len 0, tau 1) or DFlash round of `concurrency` sequences at context
        `ctx`; prompt_len/output_len > 0 add the share of the prompt passes of new requests.
        plain=False: a draft_len 0 round of the DFlash server instead of the stock engine's AR step
        (they differ only where verify recomputes its sequence: its rounds are context requests)."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if draft_len < 0 or draft_len >= max(2, self.dep.block_size):
            raise UserError(f"draft length {draft_len}: must be in 0..{self.dep.block_size - 1} "
                            f"(speculative.block_size {self.dep.block_size})")
        c = concurrency
        if draft_len == 0:
            target = self.target_pass(c, 1, ctx) if plain else self.verify_pass(c, 1, ctx)
            verify = 1 if plain else len(self.verify_steps(c, 1, ctx))
            drafter, tau = ZERO, 1.0
        else:
            target = self.verify_pass(c, draft_len + 1, ctx)
            verify = len(self.verify_steps(c, draft_len + 1, ctx))
            drafter = self.drafter_pass(c, draft_len, ctx, tau)
        passes = verify + (draft_len > 0)  # a DFlash round launches the drafter's pass, then verify's
        overhead = passes * self.rates.step_s + c * self.rates.seq_s
        if self.dep.round_loop and (draft_len or not plain):  # a round of our serving loop, not the stock engine's
            overhead += self.rates.loop_s + c * self.rates.loop_request_s
        t_pre = self.prefill(prompt_len) + self.rates.step_s if prompt_len > 0 else 0.0
        share = c * t_pre / max(1.0, (output_len - 1) / tau) if output_len > 0 else 0.0
        return StepCost(c, draft_len, tau, target, drafter, overhead, share, t_pre, max(0, output_len))

    def with_assumptions(self, **changes) -> StepModel:
        return StepModel(self.dep, replace(self.a, **changes))
