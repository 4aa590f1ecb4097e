"""How TensorRT-LLM 1.2.x lays out the engine backend's target engine, as rules over a recipe:
which attention features `build()` leaves on, whether the Executor then honours KV-cache block
reuse, and the longest prompt it accepts. One definition, used by the recipe rules (`check`)
and by the build plan (engines/plan.py), read from upstream (NVIDIA/TensorRT-LLM, 1.2 line):

- tensorrt_llm/builder.py build(), the block "Logics to control paged_context_fmha and
  fp8_context_fmha" (stored copies: the October 2025 main line before PR #8330, and
  NVIDIA/TensorRT-LLM@008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc: the same block);
- tensorrt_llm/_common.py check_max_num_tokens (opt_num_tokens);
- cpp/tensorrt_llm/common/attentionOp.cpp, AttentionOp's constructor (FMHA dtypes);
- cpp/tensorrt_llm/batch_manager/trtGptModel.h (the runtime max input length) and
  trtGptModelInflightBatching.cpp fixExecutorConfig (when block reuse is switched off);
- cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate (prompt and output limits).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_dflash.recipe.schema import Recipe
from trtllm_dflash.recipe.support import backend as backend_spec

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# A checkpoint's quantization.quant_algo per weight format (convert / quantize write it).
QUANT_ALGO = {"fp8": "FP8", "nvfp4": "NVFP4"}
# build(): FP8 context FMHA exists only for these quant_algo values.
FP8_CONTEXT_FMHA_ALGOS = ("FP8", "W4A8_AWQ", "NVFP4")
# attentionOp.cpp: fused context attention exists for these dtypes only; any other "falls back to
# unfused MHA because of unsupported data type", which cannot attend over a reused (paged) prefix.
FMHA_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class AttentionFlags:
    """The gpt_attention_plugin features an engine ends up with, and why a request changed."""

    context_fmha: bool
    paged_context_fmha: bool
    fp8_context_fmha: bool
    why: tuple[str, ...] = ()


def resolve_attention(dtype: str, quant_algo: str | None, kv_fp8: bool, sm: int | None, *, paged: bool = True,
                      fp8: bool = False) -> AttentionFlags:
    """build()'s resolution of use_paged_context_fmha (`paged`) and use_fp8_context_fmha (`fp8`)
    asked for with context FMHA on, after attentionOp.cpp's dtype fallback. `sm` None: the
    building GPU is unknown (a cpu recipe) and taken to be Ada or newer, as every GPU of
    recipe/catalog/hardware.yaml is."""
    if dtype not in FMHA_DTYPES:
        return AttentionFlags(False, False, False, (
            f"{dtype} has no fused context attention (attentionOp.cpp falls back to unfused MHA): context FMHA, "
            "paged context FMHA and FP8 context FMHA are off",))
    if quant_algo not in FP8_CONTEXT_FMHA_ALGOS or (sm is not None and sm < 89):
        reason = (f"FP8 context FMHA needs an FP8, W4A8_AWQ or NVFP4 checkpoint (quant_algo is {quant_algo})"
                  if quant_algo not in FP8_CONTEXT_FMHA_ALGOS else f"FP8 context FMHA needs sm >= 89 (sm {sm})")
        off = (["use_fp8_context_fmha"] if fp8 else []) + (["use_paged_context_fmha"] if paged and kv_fp8 else [])
        why = [f"{reason}: build() turns {' and '.join(off)} off"] if off else []
        if paged and kv_fp8:
            why[0] += " (paged context FMHA over an FP8 KV cache needs FP8 context FMHA)"
        return AttentionFlags(True, paged and not kv_fp8, False, tuple(why))
    if paged and fp8 != kv_fp8:
        return AttentionFlags(True, True, kv_fp8, (
            "under paged context FMHA build() sets use_fp8_context_fmha to match the KV cache (on for FP8 KV)",))
    return AttentionFlags(True, paged, fp8)


def default_opt_num_tokens(max_batch_size: int, max_beam_width: int, max_num_tokens: int) -> int:
    """check_max_num_tokens: with remove_input_padding and one optimization profile, an unset
    opt_num_tokens becomes min(max_batch_size * max_beam_width, max_num_tokens)."""
    return min(max_batch_size * max_beam_width, max_num_tokens)


def runtime_max_input_len(*, max_seq_len: int, max_input_len: int, max_num_tokens: int, context_fmha: bool,
                          chunked_context: bool = False) -> int:
    """The longest prompt the 1.2.1 Executor accepts (trtGptModel.h, TrtGptModel's constructor):
    max_seq_len - 1 with chunked context; min(max_seq_len - 1, max_num_tokens) with context FMHA
    and packed input; else the engine's max_input_len. A longer prompt is an error response
    ("Prompt length (%d) exceeds maximum input length (%d)", LlmRequest::validate)."""
    if chunked_context:
        return max_seq_len - 1
    if context_fmha:
        return min(max_seq_len - 1, max_num_tokens)
    return max_input_len


def kv_reuse_honoured(requested: bool, *, paged_context_fmha: bool, gather_context_logits: bool = False) -> bool:
    """fixExecutorConfig: block reuse is switched off, with a warning and no error, for an engine
    built without paged context FMHA or one that returns context logits."""
    return requested and paged_context_fmha and not gather_context_logits


def max_draft_len(recipe: Recipe) -> int:
    """The longest draft of any concurrency band: block_size - 1 without bands."""
    spec = recipe.speculative
    return max((b.draft_len for b in spec.bands), default=spec.block_size - 1)


def target_seq_len(recipe: Recipe) -> int:
    """The target engine's max_seq_len: the last verify block may reach max_draft_len tokens past
    build.max_seq_len."""
    return recipe.build.max_seq_len + max_draft_len(recipe)


def target_attention(recipe: Recipe) -> AttentionFlags:
    """The target engine's attention features: paged context FMHA asked for (KV block reuse
    across verify rounds), FP8 context FMHA asked for with an FP8 KV cache."""
    q = recipe.quantization
    kv_fp8 = q.kv_cache == "fp8"
    return resolve_attention(DTYPE_NAMES[q.checkpoint_dtype("target")], QUANT_ALGO.get(q.target_weights), kv_fp8,
                             recipe.gpu.sm, paged=True, fp8=kv_fp8)


# Open upstream bug: wrong outputs when KV blocks are reused over an FP8 KV cache (FP8 checkpoint,
# paged + FP8 context FMHA; reported on 0.16, still wrong on a later main in the thread). Our
# verify rounds reuse their own prefix that way every round, so over an FP8 KV cache reuse is
# opt-in (build.kv_cache_reuse: true) until the GPU checks show it exact on 1.2.1.
FP8_KV_REUSE_ISSUE = "https://github.com/NVIDIA/TensorRT-LLM/issues/2699"


def kv_reuse_decision(recipe: Recipe) -> tuple[bool, str]:
    """(whether the target Executor reuses KV blocks across verify rounds, why): build.kv_cache_reuse
    where the engine has paged context FMHA; left unset (None) it is on, except over an FP8 KV
    cache (FP8_KV_REUSE_ISSUE)."""
    asked, flags = recipe.build.kv_cache_reuse, target_attention(recipe)
    if not flags.paged_context_fmha:
        return False, "; ".join(flags.why)
    if asked is False:
        return False, "build.kv_cache_reuse false"
    if recipe.quantization.kv_cache == "fp8":
        if asked is None:
            return False, (f"an FP8 KV cache: reused blocks gave wrong outputs upstream ({FP8_KV_REUSE_ISSUE}, open); "
                           "build.kv_cache_reuse true opts in")
        return True, f"paged context FMHA; asked for over an FP8 KV cache despite {FP8_KV_REUSE_ISSUE}"
    return True, "paged context FMHA"


def kv_block_reuse(recipe: Recipe) -> bool:
    """Whether the target Executor reuses KV blocks across verify rounds (kv_reuse_decision)."""
    return kv_reuse_decision(recipe)[0]


# TensorRT-LLM 1.2.1's scheduler, unchunked (cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp,
# the context loop: `reqNumTokens = llmReq->getNumTokens(beam) + getNumDraftTokens()`, then `break`
# at the first request that would pass maxNumTokensRuntime, and at maxBatchSizeRuntime): a context
# request is charged its whole prompt. Reused KV blocks are found only after scheduling
# (BlockManager::addSequence -> setPrepopulatedPromptLen), and the credit for them (PR #11637) is on
# main only (PR #12768: the reusable-token estimates "do not exist in release/1.2.1"). So a verify
# round of design C, a context request of the whole sequence per row, fits only
# max_num_tokens // (sequence length) rows into one Executor step, whatever the reuse saves.
STEP_RULE = ("TensorRT-LLM 1.2.1's microBatchScheduler charges each context request its whole sequence "
             "(reused KV blocks included)")


def requests_per_step(lengths: list[int], max_num_tokens: int, max_batch_size: int) -> int:
    """How many queued context requests (in order, of these prompt lengths) one Executor step
    takes; at least one (LlmRequest::validate keeps a prompt within max_num_tokens)."""
    n, total = 0, 0
    for length in lengths[:max_batch_size]:
        if total + length > max_num_tokens:
            break
        n, total = n + 1, total + length
    return max(n, 1)


def step_sizes(requests: int, length: int, max_num_tokens: int, max_batch_size: int) -> list[int]:
    """The rows of each Executor step a round of `requests` context requests of `length` tokens takes."""
    per = requests_per_step([length] * min(requests, max_batch_size), max_num_tokens, max_batch_size)
    full, rest = divmod(requests, per)
    return [per] * full + ([rest] if rest else [])


# TensorRT's per-tensor volume limit: a step of max_num_tokens tokens whose widest per-token tensor
# passes it fails at run time with "tensor volume exceeds 2147483647" and every request in flight
# fails (https://github.com/NVIDIA/TensorRT-LLM/issues/2422; tensorrt_llm/_common.py
# check_max_num_tokens warns above 16384 for this reason).
TENSOR_VOLUME = 2**31 - 1
TENSOR_VOLUME_ISSUE = "https://github.com/NVIDIA/TensorRT-LLM/issues/2422"


def widest_per_token(recipe: Recipe) -> tuple[int, str]:
    """(elements, what) of the target engine's widest per-token activation on one rank."""
    t, d, tp = recipe.target_facts, recipe.drafter_facts, recipe.parallel.tp
    ffn = t.intermediate_size if not t.is_moe else t.experts_per_token * t.moe_intermediate_size
    qkv = (t.num_attention_heads + 2 * t.num_kv_heads) * t.head_dim // tp
    return max((len(d.target_layer_ids or []) * t.hidden_size, "the captured features' concat"),
               (2 * ffn // tp, "the fused gate and up projection"), (qkv, "the fused QKV projection"))


def max_step_tokens(recipe: Recipe) -> int:
    """The largest max_num_tokens whose widest per-token tensor stays within TENSOR_VOLUME."""
    return TENSOR_VOLUME // widest_per_token(recipe)[0]


@dataclass(frozen=True)
class VerifyCost:
    """What one verify round of the engine backend's design C costs the target, in tokens per
    sequence and in Executor steps: each round is a fresh context request holding the whole
    sequence, so without KV block reuse the target runs the committed context again (a prefill per
    round), with it only the anchor and the drafts; and the scheduler charges every request its
    whole sequence either way (STEP_RULE), so a round of many long sequences takes several steps,
    each reading the target's weights again. External draft tokens (`draft_tokens_external`) do not
    change this: 1.2.1 also verifies them in the context phase of a fresh request per round and
    refuses to start without block reuse (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp:
    "KV cache block reuse must be enabled for speculative decoding target model")."""

    recomputes: bool
    why: str
    context: int  # the sweep's mid-decode context: input_len + output_len / 2
    block: int  # anchor + max_draft_len
    max_num_tokens: int | None = None  # the engine backend's Executor step budget (None: no such rule)
    max_batch_size: int = 1
    planned: int = 1  # the concurrency the recipe plans for: its largest sweep level, up to max_batch_size
    step_tokens_cap: int | None = None  # the largest step budget within TensorRT's tensor volume (max_step_tokens)

    @property
    def tokens(self) -> int:
        """Target tokens one verify round runs per sequence at `context`."""
        return self.context + self.block if self.recomputes else self.block

    def steps(self, concurrency: int) -> list[int]:
        """The rows of each Executor step a round of `concurrency` sequences at `context` takes."""
        if self.max_num_tokens is None:
            return [concurrency]
        return step_sizes(concurrency, self.context + self.block, self.max_num_tokens, self.max_batch_size)

    def describe(self) -> str:
        """The lines check, plan, build --dry-run and project print."""
        c = self.planned
        if not self.recomputes:
            line = f"verify: {self.why}: a round runs its {self.block} new tokens per sequence"
        else:
            line = (f"verify: {self.why}: every round recomputes its whole sequence, "
                    f"{self.tokens} target tokens per sequence at the sweep's mid-decode context of {self.context} "
                    f"against {self.block} with reuse ({self.tokens / self.block:.0f}x)")
        steps = self.steps(c)
        if self.max_num_tokens is None or len(steps) == 1:
            return line + ("" if self.max_num_tokens is None else f"; a round of {c} sequences is one Executor step")
        need = c * (self.context + self.block)
        one = (f"build.max_num_tokens {need} makes it one step" if self.step_tokens_cap is None
               or need <= self.step_tokens_cap
               else f"one step would need {need} tokens, past TensorRT's tensor volume above {self.step_tokens_cap}")
        return (line + f"; a round of {c} sequences takes {len(steps)} Executor steps: max_num_tokens "
                f"{self.max_num_tokens} holds {steps[0]} sequences of {self.context + self.block} tokens ({one})")


def verify_cost(recipe: Recipe) -> VerifyCost:
    """The engine backend's verify cost for a recipe (kv_reuse_decision, STEP_RULE); other backends
    verify inside the sequence's own generation step (recomputes False, one step)."""
    context = recipe.sweep.input_len + recipe.sweep.output_len // 2
    block = max_draft_len(recipe) + 1
    b = recipe.build
    planned = min(max(recipe.sweep.concurrency, default=1), b.max_batch_size)
    if not backend_spec(recipe.backend.name).builds_engines:
        return VerifyCost(False, f"the {recipe.backend.name} backend verifies in each sequence's generation step",
                          context, block, planned=planned)
    on, why = kv_reuse_decision(recipe)
    return VerifyCost(not on, f"KV block reuse {'on' if on else 'off'} ({why})", context, block, b.max_num_tokens,
                      b.max_batch_size, planned, max_step_tokens(recipe))
