"""The engine backend's model classes for TensorRT-LLM 1.2.x's stock `trtllm-build`
(`--model_cls_file <this file> --model_cls_name <class>`; engines/plan.py writes the commands).

GPU-only: imports tensorrt_llm at the top (trtllm-build loads this file with
importlib.machinery.SourceFileLoader('models', path) in tensorrt_llm/commands/build.py main,
before `PretrainedConfig.from_json_file` reads the checkpoint's architecture, so the
MODEL_MAP registration at the bottom is in place by then).

DFlashQwen3Target / DFlashLlamaTarget   the stock QWenForCausalLM / LLaMAForCausalLM
    (tensorrt_llm/models/{qwen,llama}/model.py) plus the DFlash tap: the residual outputs of
    layers `target_layer_ids` -> networks.target_tap (the drafter's fc + hidden_norm, read from
    the drafter checkpoint beside the target one) -> `dflash_ctx`; each sequence's last `tail`
    rows of it (`dflash_tail`), their logits (`dflash_logits`) and greedy tokens
    (`dflash_argmax`). Names and shapes: formats/engine_io.py, engines/interfaces.py `target_io`.
DFlashDrafter   our PretrainedModel (tensorrt_llm/models/modeling_utils.py) with parameters
    named as formats/weight_maps.py DRAFTER_MAP; forward = networks.drafter_forward over
    TrtllmOps (engines/ops_trtllm.py). I/O as engines/interfaces.py `drafter_io`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import OrderedDict

import numpy as np
import tensorrt as trt
from tensorrt_llm.functional import Tensor, argmax, concat, constant, index_select, maximum, shape, slice, unsqueeze
from tensorrt_llm.graph_rewriting import Layer as RewriteLayer
from tensorrt_llm.layers import ColumnLinear, Embedding, RmsNorm, RowLinear
from tensorrt_llm.models import MODEL_MAP, LLaMAForCausalLM, QWenForCausalLM
from tensorrt_llm.models.modeling_utils import PretrainedConfig, PretrainedModel
from tensorrt_llm.module import Module, ModuleList
from tensorrt_llm.parameter import Parameter
from tensorrt_llm.plugin import current_all_reduce_helper

from trtllm_dflash.engines.ops_trtllm import TrtllmOps
from trtllm_dflash.formats import engine_io
from trtllm_dflash.formats.weight_maps import Heads
from trtllm_dflash.reference.config import DraftConfig
from trtllm_dflash.runtime.networks import DrafterSpec, drafter_forward, target_tap

# TensorRT-LLM's default exclusions (tensorrt_llm/quantization/quantize.py quantize_layers), kept when
# a checkpoint gives none: a list in the config replaces them.
_DEFAULT_EXCLUDED = ["*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                     "*shared_expert_gate", "*fused_a"]


class _Tap(Module):
    """`dflash.fc` (n*H -> H, column-parallel, gathered) and `dflash.hidden_norm`, the drafter's
    fusion of the tapped layers; layers from tensorrt_llm/layers/{linear,normalization}.py."""

    def __init__(self, config, num_taps: int):
        super().__init__()
        m = config.mapping
        self.fc = ColumnLinear(num_taps * config.hidden_size, config.hidden_size, bias=False, dtype=config.dtype,
                               tp_group=m.tp_group, tp_size=m.tp_size, gather_output=True)
        self.hidden_norm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)


def _tapped(cls):
    """A subclass of a decoder layer class whose forward keeps its output hidden states (the
    residual stream after the layer = HF hidden_states[i + 1]) on the instance. Wraps
    QWenDecoderLayer / LLaMADecoderLayer.forward (tensorrt_llm/models/{qwen,llama}/model.py), called
    by DecoderLayerList.forward (models/modeling_utils.py), which returns (hidden, presents) with
    use_cache; valid without reduce_fusion (build() turns it off for Qwen and for tp 1)."""

    class Tapped(cls):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            self.dflash_out = out[0] if isinstance(out, tuple) else out  # (hidden, presents) with use_cache
            return out

    Tapped.__name__ = Tapped.__qualname__ = f"DFlashTapped{cls.__name__}"
    return Tapped


class _TapTarget:
    """The DFlash tap over a stock DecoderModelForCausalLM (mixed in before it)."""

    def __init__(self, config):
        """QWenForCausalLM / LLaMAForCausalLM.__init__ (tensorrt_llm/models/{qwen,llama}/model.py),
        after `dflash.*` joins the config's QuantConfig.exclude_modules (fnmatch patterns,
        tensorrt_llm/quantization/quantize.py quantize_layers): PretrainedModel.__post_init__
        quantizes after __init__, and the tap stays in the model dtype."""
        dflash = getattr(config, "dflash", None)
        if not dflash:
            raise ValueError(f"{type(self).__name__}: the config has no `dflash` section (from_checkpoint reads it "
                             "from the drafter checkpoint beside the target; set config.dflash for a random-weight "
                             "build)")
        if config.mapping.pp_size > 1:
            raise ValueError(f"{type(self).__name__}: pipeline parallelism is not supported (the tap needs every "
                             "layer)")
        q = config.quantization
        if q.quant_algo is not None:  # the tap runs in the model dtype (tap_weights dequantizes the drafter's fc)
            q.exclude_modules = [*(q.exclude_modules if q.exclude_modules is not None else _DEFAULT_EXCLUDED),
                                 "dflash.*"]
        super().__init__(config)
        self.tap_layer_ids = tuple(int(i) for i in dflash["target_layer_ids"])
        self.tail = int(dflash["block_size"])
        self.dflash = _Tap(config, len(self.tap_layer_ids))
        for i in self.tap_layer_ids:
            layer = self.transformer.layers[i]
            layer.__class__ = _tapped(type(layer))

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        """PretrainedModel.from_checkpoint (tensorrt_llm/models/modeling_utils.py) with the tap's
        config (`dflash`: target_layer_ids, block_size) and weights (the drafter's fc and
        hidden_norm, this rank's shard) taken from the drafter checkpoint beside `ckpt_dir`."""
        import torch
        from tensorrt_llm._utils import str_dtype_to_torch

        if config is None:
            config = PretrainedConfig.from_json_file(f"{ckpt_dir}/config.json")
        if rank is not None:
            config.set_rank(rank)
        config.dflash = engine_io.read_drafter_config(ckpt_dir)["dflash"]
        tap = engine_io.tap_weights(ckpt_dir, config.mapping.rank, str_dtype_to_torch(config.dtype))

        def hook(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            weights = preprocess_weights_hook(weights) if preprocess_weights_hook else weights
            return {**weights, **tap}

        return super().from_checkpoint(ckpt_dir, rank, config, preprocess_weights_hook=hook)

    def forward(self, **kwargs):
        """DecoderModelForCausalLM.forward (marks `logits`; returns lm_logits, hidden_states and
        all_hidden_states, the packed ln_f output, with a paged KV cache), then the DFlash outputs."""
        out = super().forward(**kwargs)
        self._mark_dflash(out[2], kwargs["last_token_ids"])
        return out

    def _mark_dflash(self, final_hidden: Tensor, last_token_ids: Tensor) -> None:
        """dflash_ctx [num_tokens, H], dflash_tail [num_seq, tail, H], dflash_logits
        [num_seq, tail, V] and dflash_argmax [num_seq, tail] (row rule: engine_io.tail_rows).
        functional.concat / slice / shape / maximum / index_select / argmax / unsqueeze
        (tensorrt_llm/functional.py); self.lm_head is the stock ColumnLinear (gathered)."""
        ops = TrtllmOps(dict(self.named_modules()))
        ctx = target_tap(ops, [self.transformer.layers[i].dflash_out for i in self.tap_layer_ids],
                         self.config.norm_epsilon)  # [num_tokens, H]
        ctx.mark_output("dflash_ctx")
        ends = last_token_ids  # [num_seq] inclusive end offsets (packed input)
        prev = slice(concat([constant(np.zeros(1, np.int32)), ends]), starts=[0], sizes=shape(ends))
        rows = unsqueeze(ends, 1) + constant(np.arange(-self.tail, 0, dtype=np.int32))  # [num_seq, tail]
        rows = maximum(rows, unsqueeze(prev, 1)).view([-1])
        index_select(ctx, 0, rows).view([-1, self.tail, self.config.hidden_size]).mark_output("dflash_tail")
        logits = self.lm_head(index_select(final_hidden, 0, rows))  # [num_seq * tail, V]
        logits.view([-1, self.tail, logits.size(1)]).mark_output("dflash_logits", self.config.logits_dtype)
        argmax(logits, 1, keepdim=True).view([-1, self.tail]).mark_output("dflash_argmax", "int32")


class DFlashQwen3Target(_TapTarget, QWenForCausalLM):
    """QWenForCausalLM (Qwen3: qwen_type 'qwen3', tensorrt_llm/models/qwen/model.py) + the DFlash tap."""


class DFlashLlamaTarget(_TapTarget, LLaMAForCausalLM):
    """LLaMAForCausalLM (tensorrt_llm/models/llama/model.py) + the DFlash tap."""


class DFlashDrafterConfig(PretrainedConfig):
    """The drafter checkpoint's config.json (convert/configs.py drafter_config): PretrainedConfig
    fields (tensorrt_llm/models/modeling_utils.py) + `dflash` and the raw HF config."""

    def __init__(self, *, dflash: dict, hf_config: dict, attn_bias: bool = False, rotary_base: float = 10000.0,
                 rotary_scaling: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.dflash, self.hf_config, self.attn_bias = dflash, hf_config, attn_bias
        self.rotary_base, self.rotary_scaling = rotary_base, rotary_scaling


class _Attention(Module):
    """q (block only), kv (context and block: [k; v]), per-head norms, dense; FP8-arena scales.
    tensorrt_llm.layers ColumnLinear / RowLinear / RmsNorm (layers/linear.py, normalization.py),
    tensorrt_llm.parameter.Parameter."""

    def __init__(self, config, heads: Heads, bias: bool, fp8_arena: bool):
        super().__init__()
        m, H, D = config.mapping, config.hidden_size, heads.head_dim
        kw = dict(dtype=config.dtype, tp_group=m.tp_group, tp_size=m.tp_size)
        self.q = ColumnLinear(H, heads.num_heads * D, bias=bias, gather_output=False, **kw)
        self.kv = ColumnLinear(H, 2 * heads.num_kv_heads * D, bias=bias, gather_output=False, **kw)
        self.q_layernorm = RmsNorm(D, eps=config.norm_epsilon, dtype=config.dtype)
        self.k_layernorm = RmsNorm(D, eps=config.norm_epsilon, dtype=config.dtype)
        self.dense = RowLinear(heads.num_heads * D, H, bias=bias, **kw)
        if fp8_arena:  # after preprocess_weights: k/v scales merged into kv_cache_scaling_factor (+ its reciprocal)
            self.kv_cache_scaling_factor = Parameter(shape=(1,), dtype="float32")
            self.kv_cache_rcp_scaling_factor = Parameter(shape=(1,), dtype="float32")


class _Mlp(Module):
    """fc = gate_proj (activated), gate = up_proj, proj = down_proj (the names of
    tensorrt_llm/layers/mlp.py GatedMLP, as separate ColumnLinear / RowLinear layers)."""

    def __init__(self, config, bias: bool):
        super().__init__()
        m, H, inter = config.mapping, config.hidden_size, config.intermediate_size
        kw = dict(dtype=config.dtype, tp_group=m.tp_group, tp_size=m.tp_size)
        self.fc = ColumnLinear(H, inter, bias=bias, gather_output=False, **kw)
        self.gate = ColumnLinear(H, inter, bias=bias, gather_output=False, **kw)
        self.proj = RowLinear(inter, H, bias=bias, **kw)


class _Layer(Module):
    """One drafter layer's parameters (tensorrt_llm.module.Module containers)."""

    def __init__(self, config, heads: Heads, fp8_arena: bool):
        super().__init__()
        self.input_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.attention = _Attention(config, heads, config.attn_bias, fp8_arena)
        self.post_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.mlp = _Mlp(config, bias=getattr(config, "mlp_bias", False))


class _Transformer(Module):
    """vocab_embedding (tensorrt_llm.layers.Embedding; made vocab-parallel by
    PretrainedModel.__post_init__'s optimize_model when use_parallel_embedding), layers, ln_f."""

    def __init__(self, config, heads: Heads, fp8_arena: bool):
        super().__init__()
        self.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = ModuleList([_Layer(config, heads, fp8_arena) for _ in range(config.num_hidden_layers)])
        self.ln_f = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)


class DFlashDrafter(PretrainedModel):
    """The DFlash drafter engine: parameters as DRAFTER_MAP names them (`transformer.*`,
    `lm_head`; the checkpoint's `dflash.*` belong to the target engine and are dropped on load),
    the arena as engine I/O (formats/engine_io.py), forward = networks.drafter_forward(TrtllmOps)."""

    config_class = DFlashDrafterConfig

    def __init__(self, config: DFlashDrafterConfig):
        super().__init__(config)
        self.draft_cfg = DraftConfig.from_dict(config.hf_config, "drafter config.json hf_config")
        d, m = self.draft_cfg, config.mapping
        heads = Heads(d.num_heads, d.num_kv_heads, d.head_dim).local(m.tp_size)
        self.spec = dataclasses.replace(DrafterSpec.from_config(d), num_heads=heads.num_heads,
                                        num_kv_heads=heads.num_kv_heads)
        self.fp8_arena = config.quantization.kv_cache_quant_algo is not None  # plan/stage accept only FP8
        self.transformer = _Transformer(config, heads, self.fp8_arena)
        self.lm_head = ColumnLinear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype,
                                    tp_group=m.tp_group, tp_size=m.tp_size, gather_output=True)

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        """PretrainedModel.from_checkpoint without the target's tap weights (`dflash.*`)."""
        def hook(weights):
            weights = preprocess_weights_hook(weights) if preprocess_weights_hook else weights
            return {k: v for k, v in weights.items() if not k.startswith("dflash.")}

        return super().from_checkpoint(ckpt_dir, rank, config, preprocess_weights_hook=hook)

    def prepare_inputs(self, max_batch_size, max_input_len, max_seq_len, max_draft_len=0, **_):
        """The drafter engine's inputs (engines/interfaces.py `drafter_io`) with one optimization profile
        (engine_io.drafter_dim_ranges). functional.Tensor(name, dtype, shape, dim_range) network
        inputs; CustomAllReduceHelper.set_workspace_tensor for tp > 1, as
        GenerationMixin.prepare_basic_inputs does (tensorrt_llm/models/generation_mixin.py)."""
        from tensorrt_llm._utils import str_dtype_to_trt

        r = engine_io.drafter_dim_ranges(max_batch_size, max_input_len, max_seq_len, max_draft_len + 1)
        s, dtype = self.spec, str_dtype_to_trt(self.config.dtype)
        kv_dtype = trt.fp8 if self.fp8_arena else dtype
        dims = lambda *names: OrderedDict((n, [list(r[n])] if n in r else [v]) for n, v in names)  # noqa: E731

        def tensor(name, dt, *named):
            return Tensor(name=name, dtype=dt, shape=[-1 if n in r else v for n, v in named], dim_range=dims(*named))

        b, t, c, sl = ("batch", 0), ("block", 0), ("new_ctx", 0), ("max_seq_len", 0)
        inputs = {
            "block_ids": tensor("block_ids", trt.int32, b, t),
            "block_positions": tensor("block_positions", trt.int32, b, t),
            "ctx_rows": tensor("ctx_rows", dtype, b, c, ("hidden", self.config.hidden_size)),
            "ctx_positions": tensor("ctx_positions", trt.int32, b, c),
            "new_ctx_lens": tensor("new_ctx_lens", trt.int32, b),
            "cache_lens": tensor("cache_lens", trt.int32, b),
        }
        arena = [tensor(name, kv_dtype, b, sl, ("kv_heads", s.num_kv_heads), ("head_dim", s.head_dim))
                 for name, _ in engine_io.arena_names(s.num_layers)]
        inputs["arena"] = list(zip(arena[0::2], arena[1::2]))
        if self.config.mapping.tp_size > 1:
            current_all_reduce_helper().set_workspace_tensor(self.config.mapping, 1)
        return inputs

    def forward(self, block_ids, block_positions, ctx_rows, ctx_positions, new_ctx_lens, cache_lens, arena):
        """networks.drafter_forward over TrtllmOps; marks draft_ids, draft_logits and the
        present_{k,v}_cache_{l} outputs (Tensor.mark_output, tensorrt_llm/functional.py)."""
        scales = None
        if self.fp8_arena:
            scales = [layer.attention.kv_cache_scaling_factor.value for layer in self.transformer.layers]
        inv_freq = self.draft_cfg.rope.inv_freq(self.draft_cfg.head_dim).numpy()
        ops = TrtllmOps(dict(self.named_modules()), inv_freq, arena, cache_lens, new_ctx_lens, scales)
        logits = drafter_forward(ops, self.spec, block_ids, block_positions, ctx_rows, ctx_positions)  # [B, T-1, V]
        logits.mark_output("draft_logits")
        draft_ids = argmax(logits, 2, keepdim=True).view([0, 0])
        draft_ids.mark_output("draft_ids", "int32")
        names = iter(out for _, out in engine_io.arena_names(self.spec.num_layers))
        for layer in range(self.spec.num_layers):
            for t in ops.present[layer]:
                t.mark_output(next(names))  # same dtype: no cast, the plugin writes the bound buffer
        return draft_ids


# tensorrt_llm/models/__init__.py MODEL_MAP: checkpoint architecture -> class
MODEL_MAP["DFlashDrafter"] = DFlashDrafter

# builder.py build() runs optimize(network): its FuseAttentionWithBiasPass visits every layer and
# calls graph_rewriting.Layer.as_layer(), which raises on a layer type missing from its map, and
# the map has no PLUGIN_V3, the type of our AOT plugin layers. Add that one entry (the pass then
# sees no GPTAttention plugin in them and leaves them alone).
RewriteLayer.TRT_LAYER_TYPE_TO_LAYER.setdefault(trt.LayerType.PLUGIN_V3, trt.IPluginV3Layer)

# trtllm-build imports this file as module "models"; `--workers > 1` pickles the classes into spawned
# processes (commands/build.py parallel_build), which can import them only under the package name.
_PACKAGE_NAME = "trtllm_dflash.engines.trtllm_models"
if __name__ != _PACKAGE_NAME:
    sys.modules.setdefault(_PACKAGE_NAME, sys.modules[__name__])
    for _cls in (DFlashQwen3Target, DFlashLlamaTarget, DFlashDrafterConfig, DFlashDrafter):
        _cls.__module__ = _PACKAGE_NAME
