"""TrtllmOps: the networks' op set (runtime/networks.py) on TensorRT-LLM 1.2.x functional tensors, inside
a network under construction (GPU-only: imported by trtllm_models.py, which trtllm-build loads).

Weights are not touched here: `linear`, `rms_norm` and `embed` call the model's TensorRT-LLM
layer registered under the checkpoint name (ColumnLinear / RowLinear / RmsNorm / Embedding,
built by trtllm_models.py), so tensor parallelism (gather / all-reduce) and quantization (FP8 /
NVFP4 layers swapped in by tensorrt_llm.quantization.quantize at model construction) are
TensorRT-LLM's own. The rest maps one op to a few functional calls; the drafter's arena ops are
the AOT plugins of plugins/kv_inject_attention (trt_plugin.kv_append_trtllm and
kv_inject_attention_trtllm).

Arena transport (docs/design/engine-path.md, "Drafter engine"): each drafter layer's context cache is a pair of network
inputs `k_cache_{l}` / `v_cache_{l}` [B, S_max, Hkv, D]; `inject` appends this step's rows with
the kv_append plugin, whose outputs (`present_*`) trtllm_models.py marks as engine outputs and the
runner binds to the input buffers; `attend` reads the input buffers with the append's lens_out
as its cache lengths, which orders it after the append.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from tensorrt_llm.functional import Tensor, cast, concat, constant, cos, shape, silu, sin, slice, split, unsqueeze

from trtllm_dflash.plugins.kv_inject_attention.trt_plugin import kv_append_trtllm, kv_inject_attention_trtllm


class TrtllmOps:
    """networks.Ops over `modules` {checkpoint name without `.weight`: TensorRT-LLM layer}.

    Drafter only: `inv_freq` [D/2] float32 (RoPE, computed like reference/target.py Rope),
    `arena` [(k_cache, v_cache) network inputs per layer], `cache_lens` / `new_lens` [B] int32
    network inputs, `kv_scales` [float32 [1] tensor per layer] for an FP8 arena (None otherwise).
    """

    def __init__(self, modules: dict, inv_freq: np.ndarray | None = None, arena: Sequence | None = None,
                 cache_lens: Tensor | None = None, new_lens: Tensor | None = None, kv_scales: Sequence | None = None):
        self.m, self.inv_freq, self.arena = modules, inv_freq, arena
        self.cache_lens, self.new_lens, self.kv_scales = cache_lens, new_lens, kv_scales
        self.present: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (k, v) arena after the append
        self.lens: dict[int, Tensor] = {}  # layer -> cache_lens + new_lens (the append's lens_out)

    def embed(self, ids, name):
        """tensorrt_llm.layers.Embedding.forward (tensorrt_llm/layers/embedding.py)."""
        return self.m[name](ids)

    def linear(self, x, name):
        """tensorrt_llm.layers.{ColumnLinear,RowLinear}.forward or their quantized replacements
        (tensorrt_llm/layers/linear.py, tensorrt_llm/quantization/layers.py); any rank >= 2."""
        return self.m[name](x)

    def rms_norm(self, x, name, eps):
        """tensorrt_llm.layers.RmsNorm.forward -> functional.rms_norm (fp32 compute) over the last
        dim; eps is the layer's own (built from the same config value)."""
        return self.m[name](x)

    def heads(self, x, n, d):
        """functional.view(x, [0, 0, n, d]) (Tensor.view; 0 copies the input dim)."""
        return x.view([0, 0, n, d])

    def merge_heads(self, x):
        """functional.view(x, [0, 0, -1])."""
        return x.view([0, 0, -1])

    def split(self, x, sizes):
        """functional.split(tensor, split_size_or_sections, dim) on the last dim."""
        return list(split(x, list(sizes), dim=x.ndim() - 1))

    def concat(self, xs):
        """functional.concat(inputs, dim) on the last dim."""
        return concat(list(xs), dim=xs[0].ndim() - 1)

    def rope(self, x, pos):
        """NeoX RoPE as reference/target.py apply_rope: x * cos + roll(x, D/2) * sin, the rotate-half
        sign folded into sin's first half; tables in fp32, then x's dtype. functional.cast /
        unsqueeze / cos / sin / concat / split / constant (tensorrt_llm/functional.py)."""
        angles = unsqueeze(cast(pos, "float32"), 2) * constant(self.inv_freq.astype(np.float32))  # [B, T, D/2]
        c, s = cos(angles), sin(angles)
        cos_t = unsqueeze(cast(concat([c, c], dim=2), x.dtype), 2)  # [B, T, 1, D]
        sin_t = unsqueeze(cast(concat([s * -1.0, s], dim=2), x.dtype), 2)
        half = x.size(3) // 2
        x1, x2 = split(x, [half, half], dim=3)
        return x * cos_t + concat([x2, x1], dim=3) * sin_t

    def silu_mul(self, a, b):
        """functional.silu(a) * b."""
        return silu(a) * b

    def add(self, a, b):
        """functional.add (Tensor.__add__)."""
        return a + b

    def drop_first_token(self, x):
        """functional.slice(x, starts=[0, 1, 0], sizes=[B, T - 1, F]) with shape()-derived sizes."""
        sizes = concat([shape(x, 0), shape(x, 1) - 1, shape(x, 2)])
        return slice(x, starts=[0, 1, 0], sizes=sizes)

    def inject(self, layer, k, v):
        """trtllm_dflash::kv_append (plugins/kv_inject_attention/trt_plugin.py kv_append_trtllm):
        k, v [B, N, Hkv, D] rows into the layer's arena at cache_lens."""
        k_cache, v_cache = self.arena[layer]
        scale = None if self.kv_scales is None else self.kv_scales[layer]
        k_out, v_out, lens = kv_append_trtllm(k_cache, v_cache, k, v, self.cache_lens, self.new_lens,
                                              k_scale=scale, v_scale=scale)
        self.present[layer], self.lens[layer] = (k_out, v_out), lens
        return None

    def attend(self, layer, q, k, v, causal, window):
        """trtllm_dflash::kv_inject_attention (trt_plugin.kv_inject_attention_trtllm) over the layer's
        arena (the input buffers, which the append wrote) and the block; [B, T, Hq, D]."""
        k_cache, v_cache = self.arena[layer]
        scale = None if self.kv_scales is None else self.kv_scales[layer]
        return kv_inject_attention_trtllm(q, k, v, k_cache, v_cache, self.lens[layer], causal_block=causal,
                                          window=window, k_scale=scale, v_scale=scale)
