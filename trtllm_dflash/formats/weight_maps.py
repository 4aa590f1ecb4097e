"""Per-architecture weight maps: HF / z-lab tensor names -> TensorRT-LLM 1.2.x checkpoint names.

A map is data. Each `Entry` names one output tensor, the source tensors it is built from and
the rule that builds rank r's shard of it; `{}` stands for the layer index and `{e}` for the
expert index. Adding an architecture is adding a map (and a `WEIGHT_MAPS` key).

Rules (what rank r of tp holds; TensorRT-LLM Linear weights are [out_features, in_features]):
  replicate   the whole tensor (norms, the MoE router)
  column      rows r*n/tp .. (r+1)*n/tp: output features (ColumnLinear)
  row         columns r*k/tp ..: input features; the GEMM output is all-reduced (RowLinear)
  vocab       rows of the vocabulary (use_parallel_embedding, embedding_sharding_dim 0; lm_head)
  qkv         [q_r; k_r; v_r]: q split by heads, k and v by KV heads (replicated when
              tp > num_kv_heads: rank r gets KV head r // (tp // num_kv_heads))
  kv          [k_r; v_r] split like qkv (the drafter's KV-injection projection)
  experts_col per expert [up_r; gate_r], stacked: [E, 2 * I/tp, H] (TensorRT-LLM's MoE `fc`)
  experts_row per expert down[:, cols_r], stacked: [E, H, I/tp] (the MoE `proj`)

Names follow TensorRT-LLM's decoder models (`tensorrt_llm/models/{llama,qwen}`): fused
`attention.qkv`, `attention.dense`, `mlp.fc` = gate_proj (the activated half), `mlp.gate` =
up_proj, `mlp.proj` = down_proj, Qwen3's per-head `attention.q_layernorm` / `k_layernorm`, and
the same layout ModelOpt's `export_tensorrt_llm_checkpoint` writes (checked in the tests).

The drafter map is our engine's DFlash drafter (`architecture: DFlashDrafter`): `dflash.fc` and
`dflash.hidden_norm` fuse the target features; every layer has a block-only query projection
`attention.q` and the KV-injection projection `attention.kv` = [k; v], which projects both the
context rows and the block rows; the target's embedding and LM head are copied in because the
drafter engine embeds its block and picks its drafts itself. A DFlash2 drafter adds its
convolutions per layer (`transformer.layers.{i}.attention_conv.base_kernel`, ...) and its
selector (`dflash2.selector.predecessor_codebook`, `successor_codebook`,
`hidden_projection.weight`), replicated on every rank and never quantized. A Laguna drafter adds
its per-feature norms (`dflash.aux_hidden_norms.{k}.weight`, replicated) and, gated, each layer's
`attention.gate.weight` (split by heads); neither is quantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Rule = Literal["replicate", "column", "row", "vocab", "qkv", "kv", "experts_col", "experts_row"]
Origin = Literal["self", "target"]


@dataclass(frozen=True)
class Entry:
    dst: str  # output name; {} = layer index
    src: tuple[str, ...]  # source names, in fusion order; {} = layer, {e} = expert
    rule: Rule
    linear: bool = False  # a GEMM weight: what FP8 / NVFP4 quantize
    share: str | None = None  # entries of a layer with the same key share their scales (fused at build time)
    origin: Origin = "self"  # "target": read from the target checkpoint (drafter map only)
    dtype: str | None = None  # force a dtype ("float32" for the MoE router); None = the checkpoint dtype


@dataclass(frozen=True)
class ArchMap:
    """The complete map of one architecture."""

    architecture: str  # TensorRT-LLM `architecture` in config.json
    top: tuple[Entry, ...]  # once per model
    attention: tuple[Entry, ...]  # every layer
    qk_norm: tuple[Entry, ...] = ()  # every layer, when the model has per-head q/k norms
    attention_bias: tuple[Entry, ...] = ()  # every layer, when attention_bias
    dense_mlp: tuple[Entry, ...] = ()  # dense layers
    mlp_bias: tuple[Entry, ...] = ()  # dense layers, when mlp_bias
    moe_mlp: tuple[Entry, ...] = ()  # sparse (MoE) layers
    conv: tuple[Entry, ...] = ()  # every layer of a DFlash2 drafter (its convolutions)
    selector: tuple[Entry, ...] = ()  # once, for a DFlash2 drafter (its candidate selector)
    fused_norms: tuple[Entry, ...] = ()  # once per fused target layer ({} = its index), for a Laguna drafter
    gate: tuple[Entry, ...] = ()  # every layer of a Laguna drafter with its output gate


L = "transformer.layers.{}."
HF = "model.layers.{}."

_EMBEDDING = (
    Entry("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), "vocab"),
    Entry("transformer.ln_f.weight", ("model.norm.weight",), "replicate"),
    Entry("lm_head.weight", ("lm_head.weight",), "vocab"),  # tied: read from embed_tokens (see `source_name`)
)
_ATTENTION = (
    Entry(L + "input_layernorm.weight", (HF + "input_layernorm.weight",), "replicate"),
    Entry(
        L + "attention.qkv.weight",
        (HF + "self_attn.q_proj.weight", HF + "self_attn.k_proj.weight", HF + "self_attn.v_proj.weight"),
        "qkv",
        linear=True,
    ),
    Entry(L + "attention.dense.weight", (HF + "self_attn.o_proj.weight",), "row", linear=True),
    Entry(L + "post_layernorm.weight", (HF + "post_attention_layernorm.weight",), "replicate"),
)
_QK_NORM = (
    Entry(L + "attention.q_layernorm.weight", (HF + "self_attn.q_norm.weight",), "replicate"),
    Entry(L + "attention.k_layernorm.weight", (HF + "self_attn.k_norm.weight",), "replicate"),
)
_ATTENTION_BIAS = (
    Entry(L + "attention.qkv.bias",
          (HF + "self_attn.q_proj.bias", HF + "self_attn.k_proj.bias", HF + "self_attn.v_proj.bias"), "qkv"),
    Entry(L + "attention.dense.bias", (HF + "self_attn.o_proj.bias",), "replicate"),  # added once, after the all-reduce
)
_DENSE_MLP = (
    Entry(L + "mlp.fc.weight", (HF + "mlp.gate_proj.weight",), "column", linear=True, share="gate_up"),
    Entry(L + "mlp.gate.weight", (HF + "mlp.up_proj.weight",), "column", linear=True, share="gate_up"),
    Entry(L + "mlp.proj.weight", (HF + "mlp.down_proj.weight",), "row", linear=True),
)
_MLP_BIAS = (
    Entry(L + "mlp.fc.bias", (HF + "mlp.gate_proj.bias",), "column"),
    Entry(L + "mlp.gate.bias", (HF + "mlp.up_proj.bias",), "column"),
    Entry(L + "mlp.proj.bias", (HF + "mlp.down_proj.bias",), "replicate"),
)
_MOE_MLP = (
    Entry(L + "mlp.router.weight", (HF + "mlp.gate.weight",), "replicate", dtype="float32"),
    Entry(
        L + "mlp.fc.weight",
        (HF + "mlp.experts.{e}.up_proj.weight", HF + "mlp.experts.{e}.gate_proj.weight"),
        "experts_col",
        linear=True,
    ),
    Entry(L + "mlp.proj.weight", (HF + "mlp.experts.{e}.down_proj.weight",), "experts_row", linear=True),
)

WEIGHT_MAPS: dict[str, ArchMap] = {
    "qwen3": ArchMap(
        "Qwen3ForCausalLM", _EMBEDDING, _ATTENTION, _QK_NORM, _ATTENTION_BIAS, _DENSE_MLP, _MLP_BIAS
    ),
    "llama": ArchMap("LlamaForCausalLM", _EMBEDDING, _ATTENTION, (), _ATTENTION_BIAS, _DENSE_MLP, _MLP_BIAS),
    "qwen3_moe": ArchMap(
        "Qwen3MoeForCausalLM", _EMBEDDING, _ATTENTION, _QK_NORM, _ATTENTION_BIAS, _DENSE_MLP, _MLP_BIAS, _MOE_MLP
    ),
}

# The drafter's own map, alike in form to the target maps above by design: a table per layout
# (z-lab names, separate q and fused kv projections for the KV-injection plugin).
D = "layers.{}."
DRAFTER_MAP = ArchMap(
    "DFlashDrafter",
    top=(
        Entry("dflash.fc.weight", ("fc.weight",), "column", linear=True),  # output all-gathered before hidden_norm
        Entry("dflash.hidden_norm.weight", ("hidden_norm.weight",), "replicate"),
        Entry("transformer.ln_f.weight", ("norm.weight",), "replicate"),
        Entry("transformer.vocab_embedding.weight", ("model.embed_tokens.weight",), "vocab", origin="target"),
        Entry("lm_head.weight", ("lm_head.weight",), "vocab", origin="target"),
    ),
    attention=(
        Entry(L + "input_layernorm.weight", (D + "input_layernorm.weight",), "replicate"),
        Entry(L + "attention.q.weight", (D + "self_attn.q_proj.weight",), "column", linear=True),
        Entry(L + "attention.kv.weight", (D + "self_attn.k_proj.weight", D + "self_attn.v_proj.weight"), "kv",
              linear=True),
        Entry(L + "attention.dense.weight", (D + "self_attn.o_proj.weight",), "row", linear=True),
        Entry(L + "post_layernorm.weight", (D + "post_attention_layernorm.weight",), "replicate"),
    ),
    qk_norm=(
        Entry(L + "attention.q_layernorm.weight", (D + "self_attn.q_norm.weight",), "replicate"),
        Entry(L + "attention.k_layernorm.weight", (D + "self_attn.k_norm.weight",), "replicate"),
    ),
    attention_bias=(
        Entry(L + "attention.q.bias", (D + "self_attn.q_proj.bias",), "column"),
        Entry(L + "attention.kv.bias", (D + "self_attn.k_proj.bias", D + "self_attn.v_proj.bias"), "kv"),
        Entry(L + "attention.dense.bias", (D + "self_attn.o_proj.bias",), "replicate"),
    ),
    dense_mlp=(
        Entry(L + "mlp.fc.weight", (D + "mlp.gate_proj.weight",), "column", linear=True, share="gate_up"),
        Entry(L + "mlp.gate.weight", (D + "mlp.up_proj.weight",), "column", linear=True, share="gate_up"),
        Entry(L + "mlp.proj.weight", (D + "mlp.down_proj.weight",), "row", linear=True),
    ),
    # DFlash2: the convolutions act on full hidden rows (before the sharded projections and after
    # their all-reduce) and the selector on full logits (after the LM head's all-gather), so every
    # rank holds all of them; none is a quantized GEMM: they stay in the drafter's dtype.
    conv=tuple(
        Entry(L + f"{c}.{w}", (D + f"{c}.{w}",), "replicate")
        for c in ("attention_conv", "mlp_conv") for w in ("base_kernel", "kernel_projection.weight")
    ),
    selector=tuple(
        Entry(f"dflash2.selector.{w}", (f"candidate_selector.{w}",), "replicate")
        for w in ("predecessor_codebook", "successor_codebook", "hidden_projection.weight")
    ),
    # Laguna: the norms act on full target features (before fc), so every rank holds them; the
    # gate [heads, H] splits by heads like q. Neither is a quantized GEMM (TensorRT-LLM's Laguna
    # drafter builds them as plain torch modules in the checkpoint dtype).
    fused_norms=(Entry("dflash.aux_hidden_norms.{}.weight", ("aux_hidden_norms.{}.weight",), "replicate"),),
    gate=(Entry(L + "attention.gate.weight", (D + "self_attn.g_proj.weight",), "column"),),
)


# ----------------------------------------------------------------------------- sharding


@dataclass(frozen=True)
class Heads:
    """Attention geometry the qkv / kv rules need."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def kv_heads_of_rank(self, rank: int, tp: int) -> range:
        if self.num_kv_heads % tp == 0:
            n = self.num_kv_heads // tp
            return range(rank * n, (rank + 1) * n)
        head = rank // (tp // self.num_kv_heads)  # tp > num_kv_heads: KV heads are replicated
        return range(head, head + 1)

    def local(self, tp: int) -> "Heads":
        """The geometry one rank holds."""
        return Heads(self.num_heads // tp, len(self.kv_heads_of_rank(0, tp)), self.head_dim)


@dataclass(frozen=True)
class Read:
    """A contiguous part of one source tensor: rows / columns [start, stop) of `dim`, or all of it."""

    name: str
    dim: int | None = None
    start: int = 0
    stop: int = 0

    def shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        if self.dim is None:
            return full
        return full[: self.dim] + (self.stop - self.start,) + full[self.dim + 1 :]


def source_name(pattern: str, layer: int | None, expert: int | None = None) -> str:
    name = pattern.replace("{}", str(layer)) if layer is not None else pattern
    return name.replace("{e}", str(expert)) if expert is not None else name


def plan_reads(
    entry: Entry, layer: int | None, rank: int, tp: int, shapes: dict[str, tuple[int, ...]], heads: Heads | None,
    experts: int
) -> list[list[Read]]:
    """What rank r reads to build `entry`: out[e] lists the pieces concatenated on dim 0 for
    expert e (one element for non-expert rules); experts_* rules stack the experts."""

    def part(name: str, dim: int, n: int) -> Read:
        size = n // tp
        return Read(name, dim, rank * size, (rank + 1) * size)

    names = [source_name(s, layer) for s in entry.src]
    rule = entry.rule
    if rule == "replicate":
        return [[Read(names[0])]]
    if rule in ("column", "vocab"):
        return [[part(names[0], 0, shapes[names[0]][0])]]
    if rule == "row":
        return [[part(names[0], 1, shapes[names[0]][1])]]
    if rule in ("qkv", "kv"):
        assert heads is not None
        d = heads.head_dim
        kv = heads.kv_heads_of_rank(rank, tp)
        pieces = [Read(n, 0, kv.start * d, kv.stop * d) for n in names]
        if rule == "qkv":
            pieces[0] = part(names[0], 0, heads.num_heads * d)
        return [pieces]
    if rule == "experts_col":
        return [[part(source_name(s, layer, e), 0, shapes[source_name(s, layer, e)][0]) for s in entry.src]
                for e in range(experts)]
    if rule == "experts_row":
        return [[part(source_name(entry.src[0], layer, e), 1, shapes[source_name(entry.src[0], layer, e)][1])]
                for e in range(experts)]
    raise ValueError(f"unknown rule {rule!r}")


def rank_part(entry: Entry, x: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank `rank`'s part of `x`, the whole (tp 1) tensor of a single-source top-level entry, by
    the entry's own rule (plan_reads: the very split convert writes per rank). The target
    engine's tap takes its rank's columns of a drafter kept whole this way."""
    if entry.rule not in ("replicate", "column", "row", "vocab") or len(entry.src) != 1:
        raise ValueError(f"{entry.dst}: rule {entry.rule!r} is not a split of one tensor")
    ((read,),) = plan_reads(entry, None, rank, tp, {entry.src[0]: tuple(x.shape)}, None, 0)
    return x if read.dim is None else x.narrow(read.dim, read.start, read.stop - read.start)


def planned_shape(entry: Entry, reads: list[list[Read]], shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    def cat(pieces: list[Read]) -> tuple[int, ...]:
        parts = [r.shape(shapes[r.name]) for r in pieces]
        return (sum(p[0] for p in parts),) + parts[0][1:]

    if entry.rule.startswith("experts_"):
        return (len(reads),) + cat(reads[0])
    return cat(reads[0])


def combine(entry: Entry, tensors: list[list[torch.Tensor]]) -> torch.Tensor:
    """Execute a plan: concatenate each expert's pieces on dim 0, stack experts."""
    per = [t[0] if len(t) == 1 else torch.cat(t, dim=0) for t in tensors]
    return torch.stack(per) if entry.rule.startswith("experts_") else per[0]


def layer_entries(m: ArchMap, *, qk_norm: bool, attention_bias: bool, mlp_bias: bool, sparse: bool,
                  conv: bool = False) -> tuple[Entry, ...]:
    """The entries of one decoder layer."""
    out = m.attention + (m.qk_norm if qk_norm else ()) + (m.attention_bias if attention_bias else ())
    out += m.conv if conv else ()
    if sparse:
        if not m.moe_mlp:
            raise ValueError(f"{m.architecture}: the map has no MoE entries")
        return out + m.moe_mlp
    return out + m.dense_mlp + (m.mlp_bias if mlp_bias else ())


def split_back(entry: Entry, layer: int | None, x: torch.Tensor, local: Heads | None,
               experts: int) -> dict[str, torch.Tensor]:
    """Inverse of one entry on one rank: the rank's tensor -> its parts under the source names
    (the rank-local shapes a tensor-parallel module holds)."""
    names = [source_name(s, layer) for s in entry.src]
    if entry.rule in ("qkv", "kv"):
        assert local is not None
        kv = local.num_kv_heads * local.head_dim
        sizes = ([local.num_heads * local.head_dim] if entry.rule == "qkv" else []) + [kv, kv]
        return dict(zip(names, torch.split(x, sizes, dim=0)))
    if entry.rule == "experts_col":
        half = x.shape[1] // 2
        out = {}
        for e in range(experts):
            up, gate = (source_name(s, layer, e) for s in entry.src)
            out[up], out[gate] = x[e, :half], x[e, half:]
        return out
    if entry.rule == "experts_row":
        return {source_name(entry.src[0], layer, e): x[e] for e in range(experts)}
    return {names[0]: x}


def model_entries(m: ArchMap, cfg, drafter: bool = False) -> list[tuple[Entry, int | None]]:
    """Every (entry, layer) of a model, in file order; `cfg` is a reference TargetConfig / DraftConfig."""
    moe = getattr(cfg, "moe", None)
    dflash2, laguna = drafter and cfg.dflash2, drafter and cfg.laguna
    out: list[tuple[Entry, int | None]] = [(e, None) for e in m.top + (m.selector if dflash2 else ())]
    out += [(e, k) for k in range(len(cfg.target_layer_ids)) for e in m.fused_norms] if laguna else []
    for i in range(cfg.num_layers):
        es = layer_entries(
            m,
            qk_norm=drafter or cfg.qk_norm,  # DFlash drafters are Qwen3 layers
            attention_bias=cfg.attention_bias,
            mlp_bias=getattr(cfg, "mlp_bias", False),
            sparse=moe is not None and moe.sparse_layers[i],
            conv=dflash2,
        )
        out += [(e, i) for e in es + (m.gate if laguna and cfg.gate else ())]
    return out
