"""Typed configs for the target and the DFlash drafter, read from their config.json.

`TargetConfig.from_dict` reads an HF config.json of a Qwen3, Llama or Qwen3-MoE model
(transformers 4.x layout with `rope_theta` / `rope_scaling`, or 5.x with
`rope_parameters`). `DraftConfig.from_dict` reads a z-lab DFlash drafter config.json
(Qwen3 keys plus `block_size`, `num_target_layers` and `dflash_config`), and
`DraftConfig.to_dict` writes that same layout back. Both share `DecoderConfig`: the fields
of their decoder layers, read from the same keys (their RoPE: rope.py).

Every problem raises `UserError` naming the file and the field (fields.py). Features we do
not implement (other RoPE types, sliding-window targets, attention sinks...) are refused
loudly here, before any weight is read. DFlash2 drafters (z-lab's DFlash2DraftModel: the
four `conv_*` / `selector_*` keys) are read into the same DraftConfig (`.dflash2`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.support import (
    DFLASH2_ARCH,
    DFLASH2_KEYS,
    FEATURES_OFF,
    LAGUNA_ARCH,
    architecture,
    architectures_of,
)
from trtllm_dflash.reference.fields import Fields
from trtllm_dflash.reference.rope import RopeConfig

ARCHS: tuple[str, ...] = architectures_of("reference")  # the reference model's architectures (the support table)
Arch = Literal[ARCHS]


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # num_experts_per_tok
    intermediate_size: int  # moe_intermediate_size
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]  # per decoder layer: MoE block (True) or dense MLP


@dataclass(frozen=True)
class DecoderConfig:
    """The fields a target and a drafter share: the shape of their decoder layers."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int

    @staticmethod
    def read(f: Fields) -> dict[str, Any]:
        """These fields from their config.json keys (the same in both files), checked."""
        hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
        kv_heads, layers = f.int("num_key_value_heads", heads), f.int("num_hidden_layers")
        if heads % kv_heads:
            raise f.fail(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        return {
            "hidden_size": hidden,
            "intermediate_size": f.int("intermediate_size"),
            "num_layers": layers,
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": f.int("head_dim", hidden // heads),
            "rms_norm_eps": f.float("rms_norm_eps", 1e-6),
            "rope": RopeConfig.from_dict(f),
            "max_position_embeddings": f.int("max_position_embeddings", 32768),
        }


@dataclass(frozen=True)
class TargetConfig(DecoderConfig):
    arch: Arch
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3 family: per-head RMSNorm on q and k
    eos_token_ids: tuple[int, ...]
    moe: MoeConfig | None = None

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str = "target config.json") -> TargetConfig:
        f = Fields(raw, where)
        arch = raw.get("model_type")
        if arch not in ARCHS:
            raise f.fail(f"model_type {arch!r} is not supported (supported: {', '.join(ARCHS)})")
        if raw.get("hidden_act", "silu") != "silu":
            raise f.fail(f"hidden_act {raw['hidden_act']!r} is not supported (only 'silu')")
        decoder = DecoderConfig.read(f)
        layers = decoder["num_layers"]
        layer_types = raw.get("layer_types") or ["full_attention"] * layers
        if raw.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
            raise f.fail("sliding-window target layers are not supported by the reference backend")
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
        moe = None
        if architecture(arch).moe:
            experts = f.int("num_experts", default=None) or f.int("num_local_experts")
            step = f.int("decoder_sparse_step", 1)
            dense = set(raw.get("mlp_only_layers") or [])
            moe = MoeConfig(
                num_experts=experts,
                top_k=f.int("num_experts_per_tok"),
                intermediate_size=f.int("moe_intermediate_size"),
                norm_topk_prob=f.bool("norm_topk_prob", False),
                sparse_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(layers)),
            )
            if moe.top_k > experts:
                raise f.fail(f"num_experts_per_tok {moe.top_k} exceeds the number of experts {experts}")
        return TargetConfig(
            **decoder,
            arch=arch,
            vocab_size=f.int("vocab_size"),
            tie_word_embeddings=f.bool("tie_word_embeddings", False),
            attention_bias=f.bool("attention_bias", False),
            mlp_bias=f.bool("mlp_bias", False),
            qk_norm=architecture(arch).qk_norm,
            eos_token_ids=eos_ids,
            moe=moe,
        )


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule when dflash_config.target_layer_ids is absent: the middle layer for one
    draft layer, else `num_draft_layers` ids spread evenly over 1 .. num_target_layers-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


# config.json keys of drafter variants this backend does not implement, with the value that
# means "feature off". A drafter using any of them is refused rather than run wrongly.
_UNSUPPORTED_DRAFT_KEYS = {
    "attention_sink_bias": None,
    "use_aux_hidden_state": None,
}

# z-lab's DFlash2DraftModel keys, the "off" value of each optional drafter feature, and the Laguna
# class (recipe/support.py, where `check` reads a drafter's variant from the same keys).
def _draft_src(raw: dict[str, Any], dcfg: dict[str, Any], key: str) -> dict[str, Any]:
    """Where z-lab reads a drafter key: dflash_config first, then the top level."""
    return dcfg if dcfg.get(key) is not None else raw


def _where_key(dcfg: dict[str, Any], key: str) -> str:
    return f"dflash_config.{key}" if key in dcfg else key


@dataclass(frozen=True)
class DraftConfig(DecoderConfig):
    """A DFlash drafter: Qwen3 decoder layers, no embedding and no LM head."""

    block_size: int  # tokens per draft block: anchor + block_size-1 mask slots
    target_layer_ids: tuple[int, ...]  # target decoder layers whose outputs are fused (HF hidden_states[id+1])
    mask_token_id: int  # a row of the target's embedding
    num_target_layers: int
    layer_types: tuple[str, ...] = ()  # "full_attention" | "sliding_attention" per draft layer
    sliding_window: int | None = None
    causal: tuple[bool, ...] = ()  # per layer: causal inside the block
    attention_bias: bool = False
    vocab_size: int | None = None  # the target's; recorded in config.json (DFlash2: its codebooks' rows)
    input_embedding_scale: float = 1.0  # multiplies the target embedding of the block
    output_multiplier: float = 1.0  # multiplies the draft logits
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap), after the multiplier
    # DFlash2 (z-lab's DFlash2DraftModel): all four set, or none (draft.py: DynamicConv, CandidateSelector)
    conv_kernel_size: int | None = None  # taps of the causal convolutions around every sublayer
    conv_group_size: int | None = None  # channels that share one dynamic tap weight
    selector_rank: int | None = None  # rank of the selector's predecessor / successor codebooks
    selector_top_k: int | None = None  # candidates per position the selector chooses among
    # Laguna (LAGUNA_ARCH): an RMSNorm per fused target layer before fc (`aux_hidden_norms.{k}`),
    # the context through each layer's input_layernorm before its K/V projection, and, with
    # `gate`, a per-head softplus gate on the attention output (`self_attn.g_proj`, [heads, H])
    laguna: bool = False
    gate: bool = False

    @property
    def dflash2(self) -> bool:
        return self.conv_kernel_size is not None

    @property
    def variant(self) -> str:
        """The drafter variant (recipe/support.py DRAFTERS) a backend must run."""
        if self.laguna:
            return "laguna"
        return "dflash2" if any(getattr(self, k) != off for k, off in FEATURES_OFF.items()) else "dflash"

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if not self.causal:
            # Convention of z-lab's later code, vLLM and SGLang: sliding layers are causal
            # inside the block, full layers bidirectional.
            object.__setattr__(self, "causal", tuple(t == "sliding_attention" for t in self.layer_types))

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str = "drafter config.json") -> DraftConfig:
        f = Fields(raw, where)
        dcfg = raw.get("dflash_config") or {}
        if not isinstance(dcfg, dict):
            raise f.fail(f"'dflash_config' is {dcfg!r}, expected an object")
        for key, off in _UNSUPPORTED_DRAFT_KEYS.items():
            if dcfg.get(key, raw.get(key, off)) != off:
                raise f.fail(f"'{key}' is set: this drafter variant is not supported by the reference backend")
        decoder = DecoderConfig.read(f)
        extras = DraftConfig._read_variant(f, raw, dcfg, decoder["hidden_size"])
        extras.update(DraftConfig._read_laguna(f, raw, decoder["num_heads"], extras))
        layers = decoder["num_layers"]
        block = f.int("block_size", default=None, lo=2, src=dcfg) or f.int("block_size", lo=2)
        n_target = f.int("num_target_layers")
        ids = dcfg.get("target_layer_ids")
        if ids is None:
            ids = default_target_layer_ids(n_target, layers)
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise f.fail(f"dflash_config.target_layer_ids is {ids!r}, expected a non-empty list of integers")
        if "mask_token_id" in dcfg:
            mask = f.int("mask_token_id", lo=0, src=dcfg)
        elif raw.get("mask_token_id") is not None:
            mask = f.int("mask_token_id", lo=0)
        else:
            raise f.fail("missing dflash_config.mask_token_id")
        layer_types = raw.get("layer_types") or ["full_attention"] * layers
        if len(layer_types) != layers or any(t not in ("full_attention", "sliding_attention") for t in layer_types):
            raise f.fail(
                f"layer_types is {layer_types!r}, expected {layers} entries of 'full_attention' / 'sliding_attention'"
            )
        window = None
        if "sliding_attention" in layer_types:
            window = f.int("sliding_window")
        causal_override = dcfg.get("causal", raw.get("is_causal"))
        if causal_override is not None and not isinstance(causal_override, bool):
            raise f.fail(f"is_causal / dflash_config.causal is {causal_override!r}, expected true or false")
        return DraftConfig(
            **decoder,
            block_size=block,
            target_layer_ids=tuple(ids),
            mask_token_id=mask,
            num_target_layers=n_target,
            layer_types=tuple(layer_types),
            sliding_window=window,
            causal=() if causal_override is None else (causal_override,) * layers,
            attention_bias=f.bool("attention_bias", False),
            vocab_size=f.int("vocab_size", None),
            **extras,
        )

    @staticmethod
    def _read_variant(f: Fields, raw: dict[str, Any], dcfg: dict[str, Any], hidden: int) -> dict[str, Any]:
        """The logit / embedding scalars and the DFlash2 fields, checked one by one."""
        out: dict[str, Any] = {}
        for key in ("input_embedding_scale", "output_multiplier"):
            out[key] = f.float(key, 1.0, src=_draft_src(raw, dcfg, key))
        cap = _draft_src(raw, dcfg, "final_logit_softcapping").get("final_logit_softcapping")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 0):
            raise f.fail(f"{_where_key(dcfg, 'final_logit_softcapping')} is {cap!r}, expected a number >= 0 (0 = off)")
        out["final_logit_softcapping"] = float(cap) if cap else None  # z-lab: 0 / null = no cap
        given = [k for k in DFLASH2_KEYS if _draft_src(raw, dcfg, k).get(k) is not None]
        archs = raw.get("architectures") or []
        if not given:
            if DFLASH2_ARCH in archs:
                raise f.fail(f"architectures names {DFLASH2_ARCH} but dflash_config.{DFLASH2_KEYS[0]} is missing")
            return out
        for k in DFLASH2_KEYS:
            if k not in given:
                raise f.fail(f"missing dflash_config.{k} (a DFlash2 drafter sets {', '.join(DFLASH2_KEYS)}; "
                             f"{given[0]} is set)")
        if archs and DFLASH2_ARCH not in archs:
            raise f.fail(f"architectures is {archs!r} but {_where_key(dcfg, given[0])} is set (a DFlash2 key); "
                         f"expected [{DFLASH2_ARCH!r}]")
        for k in DFLASH2_KEYS:
            out[k] = f.int(k, src=_draft_src(raw, dcfg, k))
        if hidden % out["conv_group_size"]:
            raise f.fail(f"{_where_key(dcfg, 'conv_group_size')} {out['conv_group_size']} does not divide "
                         f"hidden_size {hidden}")
        vocab = f.int("vocab_size", None)
        if vocab is None:
            raise f.fail("missing required field 'vocab_size' (DFlash2's selector codebooks have one row per token)")
        if out["selector_top_k"] > vocab:
            raise f.fail(f"{_where_key(dcfg, 'selector_top_k')} {out['selector_top_k']} exceeds vocab_size {vocab}")
        return out

    @staticmethod
    def _read_laguna(f: Fields, raw: dict[str, Any], heads: int, extras: dict[str, Any]) -> dict[str, Any]:
        """A Laguna drafter's fields (none for others), and what of Laguna we do not run, refused."""
        if not any("Laguna" in str(a) for a in raw.get("architectures") or []):
            return {}
        if any(extras.get(k, off) != off for k, off in FEATURES_OFF.items()):
            raise f.fail("a Laguna drafter with DFlash2 keys or logit / embedding scalars is not supported")
        gating = raw.get("gating", True)  # TensorRT-LLM's default for Laguna drafters
        if gating not in (True, False, "per-head", "disabled"):
            raise f.fail(f"gating is {gating!r}: only per-head gating (true / 'per-head') or none ('disabled' / false) "
                         "is supported (TensorRT-LLM's DFlashLagunaForCausalLM refuses the others too)")
        per_layer = raw.get("num_attention_heads_per_layer")
        if per_layer is not None and (not isinstance(per_layer, list) or any(n != heads for n in per_layer)):
            raise f.fail(f"num_attention_heads_per_layer is {per_layer!r}: per-layer head counts are not supported "
                         f"(every draft layer has num_attention_heads {heads})")
        mlp_types = raw.get("mlp_layer_types") or []
        if f.int("num_experts", 0, lo=0) > 0 and isinstance(mlp_types, list) and "sparse" in mlp_types:
            raise f.fail("mlp_layer_types has 'sparse' layers: a mixture-of-experts drafter is not supported")
        draft_vocab, vocab = raw.get("draft_vocab_size"), raw.get("vocab_size")
        if draft_vocab is not None and draft_vocab != vocab:
            raise f.fail(f"draft_vocab_size {draft_vocab!r} differs from vocab_size {vocab!r}: a drafter vocabulary "
                         "of its own is not supported")
        return {"laguna": True, "gate": gating in (True, "per-head")}

    def to_dict(self) -> dict[str, Any]:
        """The z-lab config.json layout (Qwen3 keys + block_size + dflash_config)."""
        if self.rope.scaling is not None:
            raise NotImplementedError("saving a drafter with scaled RoPE is not implemented")
        arch = LAGUNA_ARCH if self.laguna else DFLASH2_ARCH if self.dflash2 else "DFlashDraftModel"
        out = {
            "architectures": [arch],
            "model_type": "llama" if self.laguna else "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "use_sliding_window": self.sliding_window is not None,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id},
        }
        if self.vocab_size is not None:
            out["vocab_size"] = self.vocab_size
        if self.laguna:
            out["gating"] = "per-head" if self.gate else "disabled"
        out["dflash_config"].update({k: getattr(self, k) for k, off in FEATURES_OFF.items() if getattr(self, k) != off})
        default_causal = tuple(t == "sliding_attention" for t in self.layer_types)
        if self.causal != default_causal:
            if len(set(self.causal)) != 1:
                raise NotImplementedError("per-layer causal flags that differ from layer_types cannot be saved")
            out["dflash_config"]["causal"] = self.causal[0]
        return out
