"""Architecture facts of targets and DFlash drafters, and the model catalog.

Planning and validation need only these numbers, never the weights, so a recipe
for a 120B model can be checked on a laptop. Facts come from the catalog
(`catalog/models.yaml`), from inline recipe fields, or from a local checkpoint's
config.json (HF target or z-lab drafter layout).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.support import ARCHITECTURES, drafter_variant

# A model's family: a target architecture of the support table (recipe/support.py ARCHITECTURES,
# where a new one is declared) or "dflash", every drafter variant.
Family = Literal[(*ARCHITECTURES, "dflash")]

# HF `model_type` -> our family name: the target architectures of the support table.
HF_MODEL_TYPES: dict[str, Family] = {m: m for m in ARCHITECTURES}


class ArchFacts(BaseModel):
    """Shape facts of one model. Drafters (family 'dflash') also carry the DFlash keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Family
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(ge=0, description="dense FFN width; 0 for MoE-only models")
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    num_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    moe_intermediate_size: int = Field(default=0, ge=0)
    sliding_window: int | None = Field(default=None, gt=0)
    sliding_layers: int = Field(default=0, ge=0, description="how many layers use sliding_window")
    max_position_embeddings: int | None = Field(default=None, gt=0)
    # DFlash drafter keys (family 'dflash' only).
    block_size: int | None = Field(default=None, gt=1, description="block size the drafter was trained with")
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = Field(default=None, ge=0)
    variant: str = Field(default="dflash", description="drafter variant (recipe/support.py DRAFTERS)")

    @model_validator(mode="after")
    def _consistent(self) -> "ArchFacts":
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts):
            raise ValueError("experts_per_token must be in 1..num_experts for an MoE model")
        if self.num_experts and not self.moe_intermediate_size:
            raise ValueError("moe_intermediate_size is required for an MoE model")
        if not self.num_experts and not self.intermediate_size:
            raise ValueError("intermediate_size is required for a dense model")
        if self.sliding_layers > self.num_layers:
            raise ValueError(f"sliding_layers {self.sliding_layers} > num_layers {self.num_layers}")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError("sliding_layers > 0 needs sliding_window")
        if self.family == "dflash":
            if self.block_size is None or not self.target_layer_ids:
                raise ValueError("a DFlash drafter needs block_size and target_layer_ids")
        elif self.block_size is not None or self.target_layer_ids is not None:
            raise ValueError(f"block_size / target_layer_ids are drafter keys; family is {self.family!r}")
        return self

    @property
    def is_drafter(self) -> bool:
        return self.family == "dflash"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ---- parameter counts (biases and norm weights of size <= hidden are ignored) ----

    @property
    def attention_params_per_layer(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        q = h * self.num_attention_heads * hd
        kv = 2 * h * self.num_kv_heads * hd
        o = self.num_attention_heads * hd * h
        return q + kv + o

    @property
    def mlp_params_per_layer(self) -> int:
        """Gated MLP (gate, up, down): 3*H*I; MoE: every expert plus the router."""
        h = self.hidden_size
        if self.is_moe:
            return self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
        return 3 * h * self.intermediate_size

    @property
    def linear_params(self) -> int:
        """Parameters in the decoder layers' linear layers: what quantization converts."""
        per_layer = self.attention_params_per_layer + self.mlp_params_per_layer
        fusion = len(self.target_layer_ids) * self.hidden_size**2 if self.is_drafter else 0
        return self.num_layers * per_layer + fusion

    @property
    def embedding_params(self) -> int:
        """Input embedding + LM head (0 for drafters, which share the target's)."""
        if self.is_drafter:
            return 0
        n = self.vocab_size * self.hidden_size
        return n if self.tie_word_embeddings else 2 * n

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: only experts_per_token experts)."""
        if not self.is_moe:
            return self.total_params
        h = self.hidden_size
        per_layer = (
            self.attention_params_per_layer
            + self.experts_per_token * 3 * h * self.moe_intermediate_size
            + h * self.num_experts
        )
        return self.num_layers * per_layer + self.embedding_params


class CatalogEntry(ArchFacts):
    hf_id: str


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, CatalogEntry]:
    text = resources.files("trtllm_dflash.recipe.catalog").joinpath("models.yaml").read_text()
    raw = yaml.safe_load(text)
    return {name: CatalogEntry(**facts) for name, facts in raw.items()}


def catalog_facts(name: str, where: str) -> ArchFacts:
    """Facts of a catalog entry; `where` names the recipe field for the error message."""
    catalog = model_catalog()
    if name not in catalog:
        raise UserError(f"{where}: unknown model {name!r}; catalog has: {', '.join(sorted(catalog))}")
    entry = catalog[name]
    return ArchFacts(**entry.model_dump(exclude={"hf_id"}))


def facts_from_config(config_path: Path) -> ArchFacts:
    """Read facts from a local HF target config.json or a z-lab drafter config.json."""
    try:
        cfg = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise UserError(f"{config_path}: not found") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{config_path}: not valid JSON ({e})") from None

    # Laguna / DFlash2 carry dflash_config
    is_drafter = "dflash_config" in cfg or "DFlashDraftModel" in (cfg.get("architectures") or [])
    model_type = cfg.get("model_type")
    if not is_drafter and model_type not in HF_MODEL_TYPES:
        raise UserError(
            f"{config_path}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(HF_MODEL_TYPES)}"
        )

    def need(key: str):
        if key not in cfg:
            raise UserError(f"{config_path}: missing key {key!r}")
        return cfg[key]

    facts = _common_facts(cfg, need)
    facts.update(_drafter_facts(cfg, need, config_path) if is_drafter else _target_facts(cfg, need, model_type))
    try:
        return ArchFacts(**facts)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        raise UserError(f"{config_path}: {loc}: {err['msg']}") from None


def _common_facts(cfg: dict, need) -> dict:
    """What every config.json says: the transformer's shape."""
    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    facts: dict = dict(
        num_layers=need("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or hidden // heads,
        vocab_size=need("vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        max_position_embeddings=cfg.get("max_position_embeddings"),
    )
    n_sliding = sum(t == "sliding_attention" for t in cfg.get("layer_types") or [])
    if n_sliding:
        facts.update(sliding_window=need("sliding_window"), sliding_layers=n_sliding)
    return facts


def _drafter_facts(cfg: dict, need, config_path: Path) -> dict:
    """A z-lab drafter's: its block and how it reads the target (dflash_config, or the top level)."""
    dcfg = cfg.get("dflash_config") or {}
    facts = dict(
        family="dflash",
        intermediate_size=need("intermediate_size"),
        block_size=dcfg.get("block_size", cfg.get("block_size")),
        target_layer_ids=dcfg.get("target_layer_ids"),
        mask_token_id=dcfg.get("mask_token_id", cfg.get("mask_token_id")),
        variant=drafter_variant(cfg),
    )
    if facts["target_layer_ids"] is None:
        raise UserError(f"{config_path}: missing dflash_config.target_layer_ids")
    if facts["block_size"] is None:
        raise UserError(f"{config_path}: missing block_size (top level or dflash_config)")
    return facts


def _target_facts(cfg: dict, need, model_type: str) -> dict:
    """An HF target's: its family and MLP (dense or mixture of experts)."""
    n_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if not n_experts:
        return dict(family=HF_MODEL_TYPES[model_type], intermediate_size=need("intermediate_size"))
    return dict(family=HF_MODEL_TYPES[model_type], intermediate_size=0, num_experts=n_experts,
                experts_per_token=need("num_experts_per_tok"),
                moe_intermediate_size=cfg.get("moe_intermediate_size") or need("intermediate_size"))
