"""A torch-backed stand-in for the parts of TensorRT-LLM 1.2.x (and `tensorrt`) that
engines/ops_trtllm.py and engines/trtllm_models.py call, so the GPU-only network code runs on CPU:
every functional op is evaluated eagerly on torch tensors, network inputs take their values
from a feed, marked outputs are collected.

The semantics are the ones read in upstream (tensorrt_llm/functional.py, module.py,
models/modeling_utils.py, layers/*), and strict where TensorRT is strict:
- `view(shape)`: a 0 copies the input's dim (zero_is_placeholder), one -1;
- elementwise ops: python ints / floats become constants of the other operand's type, the
  lower rank is expanded with leading 1s (broadcast_helper), and both dtypes must then match
  (a strongly typed network has no implicit promotion);
- `concat` takes ints and rank-0 tensors (shape() values); `shape(x)` is int64 (TensorRT 10);
- `index_select` wants a rank-1 index; `argmax(keepdim=False)` raises, as the stored 1.2-era
  implementation is broken on that path (it calls .get_output on a Tensor);
- `Tensor(name=..., is_network_input=True)` checks the fed value against the declared dtype,
  static dims and dim_range;
- `mark_output(name, dtype)` records whether a cast was needed;
- PretrainedModel (tensorrt_llm/models/modeling_utils.py, stored copy NVIDIA/TensorRT-LLM@01ea6d79):
  constructing one runs __post_init__ (the PostInitCaller metaclass), which quantizes the model
  as tensorrt_llm/quantization/quantize.py quantize_layers does (FP8: every ColumnLinear /
  RowLinear whose dotted name matches no exclude_modules pattern (fnmatchcase; upstream's default
  list when None) becomes an FP8Linear / FP8RowLinear with fp8 weight, weights_scaling_factor and
  activation_scaling_factor; other algorithms are refused here); from_checkpoint reads the rank
  file, runs preprocess_weights_hook, then the module-level preprocess_weights (k / v cache
  scales merged into kv_cache_scaling_factor = max(k, v) plus kv_cache_rcp_scaling_factor; FP8
  int8-stored weights viewed as fp8; an unquantized lm_head's scales dropped), then cls(config)
  and load (a parameter not provided is a RuntimeError, lm_head exempt when vocab_embedding is
  given; extra tensors only warn, kept in `unused`).
Layers compute like TensorRT-LLM's: Linear = F.linear in the weight dtype, RmsNorm in fp32 then
the input dtype times the weight, Embedding = gather. tp = 1 only.

The AOT plugins are replaced (see `install`) by the KV-injection torch reference, the append
writing into the bound arena buffer as the engine does when the runner binds present = past.
"""

from __future__ import annotations

import builtins
import json
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

import fake_graph_rewriting
import stand_in

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
          "int64": torch.int64, "fp8": torch.float8_e4m3fn}


class Net:
    """The network being 'built': feed, declared inputs, marked outputs, plugin calls."""

    def __init__(self):
        self.feed, self.inputs, self.outputs, self.casts, self.plugins = {}, {}, {}, {}, []


NET = Net()


def _dtype(d):
    return DTYPES[d] if isinstance(d, str) else d


class Tensor:
    def __init__(self, name=None, dtype=None, shape=None, dim_range=None, is_network_input=True, t=None):
        if t is not None:
            self.t = t
            return
        value = NET.feed[name]
        assert value.dtype == _dtype(dtype), f"{name}: fed {value.dtype}, declared {dtype}"
        assert len(value.shape) == len(shape), f"{name}: fed rank {value.dim()}, declared {shape}"
        for i, ((dim_name, ranges), declared, got) in enumerate(zip(dim_range.items(), shape, value.shape)):
            assert len(ranges) == 1, "one optimization profile"
            if declared == -1:
                lo, opt, hi = ranges[0]
                assert lo <= opt <= hi and lo <= got <= hi, f"{name} dim {dim_name}: {got} outside {ranges[0]}"
            else:
                assert declared == got == ranges[0], f"{name} dim {dim_name}: {got} != static {declared}"
        NET.inputs[name] = dict(dtype=_dtype(dtype), shape=list(shape), dims=list(dim_range))
        self.t = value

    @property
    def dtype(self):
        return self.t.dtype

    def ndim(self):
        return self.t.dim()

    def rank(self):
        return self.t.dim()

    def size(self, i=None):
        return tuple(self.t.shape) if i is None else self.t.shape[i]

    def view(self, shape, zero_is_placeholder=True):
        dims = shape.t.tolist() if isinstance(shape, Tensor) else list(shape)
        assert dims.count(-1) <= 1
        dims = [self.t.shape[i] if d == 0 and zero_is_placeholder else d for i, d in enumerate(dims)]
        return Tensor(t=self.t.reshape(dims))

    def mark_output(self, name=None, dtype=None):
        dtype = self.dtype if dtype is None else _dtype(dtype)
        NET.casts[name] = dtype != self.dtype
        NET.outputs[name] = self.t if dtype == self.dtype else self.t.to(dtype)

    def __add__(self, b):
        return _binary(self, b, torch.add)

    def __radd__(self, b):
        return _binary(b, self, torch.add)

    def __sub__(self, b):
        return _binary(self, b, torch.sub)

    def __mul__(self, b):
        return _binary(self, b, torch.mul)

    def __rmul__(self, b):
        return _binary(b, self, torch.mul)


def _const(x, like: Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    dtype = like.dtype if (isinstance(x, float) and like.dtype.is_floating_point) or (
        isinstance(x, int) and not like.dtype.is_floating_point) else (
        torch.float32 if isinstance(x, float) else torch.int32)
    return Tensor(t=torch.tensor([x], dtype=dtype))


def _binary(a, b, op) -> Tensor:
    a = _const(a, b) if not isinstance(a, Tensor) else a
    b = _const(b, a)
    ta, tb = a.t, b.t
    while ta.dim() < tb.dim():
        ta = ta[None]
    while tb.dim() < ta.dim():
        tb = tb[None]
    assert ta.dtype == tb.dtype, f"elementwise op on {ta.dtype} and {tb.dtype} (strongly typed: cast first)"
    return Tensor(t=op(ta, tb))


# ----------------------------------------------------------------------------- functional


def constant(arr):
    return Tensor(t=torch.from_numpy(np.ascontiguousarray(arr)).clone())


def cast(x, dtype):
    return Tensor(t=x.t.to(_dtype(dtype)))


def concat(inputs, dim=0):
    tensors = [i for i in inputs if isinstance(i, Tensor)]
    kind = tensors[0].dtype if tensors else torch.int32
    ts = []
    for i in inputs:
        t = torch.tensor([i], dtype=kind) if isinstance(i, int) else i.t
        ts.append(t.reshape(1) if t.dim() == 0 else t)
    assert len({t.dtype for t in ts}) == 1, [t.dtype for t in ts]
    return Tensor(t=torch.cat(ts, dim=dim))


def shape(x, dim=None):
    s = torch.tensor(x.t.shape, dtype=torch.int64)
    return Tensor(t=s if dim is None else s[dim])


def slice(x, starts, sizes, strides=None):  # noqa: A001 (upstream's name)
    starts = starts.t.tolist() if isinstance(starts, Tensor) else list(starts)
    sizes = sizes.t.tolist() if isinstance(sizes, Tensor) else list(sizes)
    return Tensor(t=x.t[tuple(builtins.slice(s, s + n) for s, n in zip(starts, sizes))])


def split(x, sizes, dim=0):
    return [Tensor(t=t) for t in torch.split(x.t, sizes, dim=dim)]


def unsqueeze(x, axis):
    return Tensor(t=x.t.unsqueeze(axis))


def cos(x):
    return Tensor(t=torch.cos(x.t))


def sin(x):
    return Tensor(t=torch.sin(x.t))


def silu(x):
    return Tensor(t=F.silu(x.t))


def maximum(a, b):
    return _binary(a, b, torch.maximum)


def index_select(x, dim, index):
    assert index.t.dim() == 1, "index_select wants a rank-1 index"
    return Tensor(t=torch.index_select(x.t, dim, index.t.long()))


def argmax(x, dim, keepdim=False):
    if not keepdim:
        raise NotImplementedError("argmax(keepdim=False) is broken in the stored 1.2-era functional.py")
    return Tensor(t=x.t.argmax(dim, keepdim=True).to(torch.int32))


# ----------------------------------------------------------------------------- module, layers


class Parameter:
    def __init__(self, value=None, shape=None, dtype=None, **_):
        self.dtype = _dtype(dtype) if dtype is not None else None
        self.shape = tuple(shape) if shape is not None else None
        self.raw = None if value is None else torch.as_tensor(value)

    def is_inited(self):
        return self.raw is not None

    @property
    def value(self):
        return Tensor(t=self.raw)

    @value.setter
    def value(self, v):
        v = torch.as_tensor(v)
        assert tuple(v.shape) == self.shape, f"shape {tuple(v.shape)} != {self.shape}"
        self.raw = v if self.dtype is None else v.to(self.dtype)


class Module:
    def __init__(self):
        self.__dict__["_modules"], self.__dict__["_parameters"] = {}, {}

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for store in ("_parameters", "_modules"):
            d = self.__dict__.get(store, {})
            if name in d:
                return d[name]
        raise AttributeError(name)

    def __call__(self, *a, **kw):
        return self.forward(*a, **kw)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(prefix + ("." if prefix else "") + name)

    def named_parameters(self):
        for prefix, m in self.named_modules():
            for name, p in m._parameters.items():
                if p is not None:
                    yield prefix + ("." if prefix else "") + name, p

    def named_modules_with_parent(self, prefix="", parent=None):
        yield prefix, self, parent
        for name, m in self._modules.items():
            yield from m.named_modules_with_parent(prefix + ("." if prefix else "") + name, self)


class ModuleList(Module):
    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __getitem__(self, i):
        return self._modules[str(i)]

    def __len__(self):
        return len(self._modules)


class _Linear(Module):
    def __init__(self, in_features, out_features, bias=True, dtype=None, tp_group=None, tp_size=1, gather_output=True,
                 **_):
        super().__init__()
        assert tp_size == 1, "the stand-in runs tp = 1"
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.weight = Parameter(shape=(out_features, in_features), dtype=dtype)
        self.bias = Parameter(shape=(out_features,), dtype=dtype) if bias else None

    def forward(self, x):
        w = self.weight.raw
        assert x.dtype == w.dtype, f"linear input {x.dtype}, weight {w.dtype}"
        return Tensor(t=F.linear(x.t, w, None if self.bias is None else self.bias.raw))


class ColumnLinear(_Linear):
    pass


class RowLinear(_Linear):
    pass


class FP8Linear(_Linear):
    """tensorrt_llm/quantization/layers.py FP8Linear: an fp8 weight with a per-tensor weight scale and
    a static activation scale; the input is quantized to fp8 with it, the product is in the input
    dtype."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, **kw):
        super().__init__(in_features, out_features, bias=bias, dtype=dtype, **kw)
        self.weight = Parameter(shape=(out_features, in_features), dtype="fp8")
        self.weights_scaling_factor = Parameter(shape=(1,), dtype="float32")
        self.activation_scaling_factor = Parameter(shape=(1,), dtype="float32")

    def forward(self, x):
        a, s = self.activation_scaling_factor.raw, self.weights_scaling_factor.raw
        xq = (x.t.float() / a).clamp(-448, 448).to(torch.float8_e4m3fn).float() * a
        y = F.linear(xq, self.weight.raw.float() * s)
        if self.bias is not None:
            y = y + self.bias.raw.float()
        return Tensor(t=y.to(x.dtype))


class FP8RowLinear(FP8Linear):
    pass


class RmsNorm(Module):
    def __init__(self, normalized_shape, num_groups=1, eps=1e-6, dtype=None, **_):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(shape=(normalized_shape,), dtype=dtype)

    def forward(self, x):
        w = self.weight.raw
        return Tensor(t=w * F.rms_norm(x.t.float(), w.shape, eps=self.eps).to(x.dtype))


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, dtype=None, **_):
        super().__init__()
        self.weight = Parameter(shape=(num_embeddings, embedding_dim), dtype=dtype)

    def forward(self, ids):
        return Tensor(t=F.embedding(ids.t.long(), self.weight.raw))


# ----------------------------------------------------------------------------- build config


class BuildConfig:
    """Stand-in of tensorrt_llm/builder.py BuildConfig.from_dict as the stored copy at
    NVIDIA/TensorRT-LLM@008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc reads a build_config.json (the
    dict form; the later copy that defaults every key accepts whatever this one accepts): six
    keys are popped with no default, `kv_cache_type` too whenever `plugin_config` is present
    (KVCacheType.from_string of a member name), every other key has a default; the plugin dict
    updates a default PluginConfig. Upstream imports tensorrt, so it cannot run here: this is
    written from the reading, independently of trtllm_dflash/engines/upstream.py's list."""

    def __init__(self, **values):
        self.__dict__.update(values)

    @classmethod
    def from_dict(cls, config: dict, plugin_config=None) -> "BuildConfig":
        config = json.loads(json.dumps(config))  # upstream deep-copies: the caller's dict is untouched
        values = {k: config.pop(k) for k in ("max_input_len", "max_seq_len", "max_batch_size", "max_beam_width",
                                             "max_num_tokens", "opt_num_tokens")}
        if "plugin_config" in config:
            kv = config.pop("kv_cache_type")
            if kv not in ("CONTINUOUS", "PAGED", "DISABLED"):
                raise ValueError(f"KVCacheType.from_string: {kv!r}")
            values["kv_cache_type"] = kv
        defaults = dict(opt_batch_size=8, max_prompt_embedding_table_size=0, gather_context_logits=False,
                        gather_generation_logits=False, strongly_typed=True, force_num_profiles=None,
                        weight_sparsity=False, profiling_verbosity="layer_names_only", enable_debug_output=False,
                        max_draft_len=0, speculative_decoding_mode=1, use_refit=False, input_timing_cache=None,
                        output_timing_cache=None, max_encoder_input_len=1024, weight_streaming=False,
                        use_strip_plan=False, dry_run=False, visualize_network=None, monitor_memory=False,
                        use_mrope=False)
        values.update({k: config.pop(k, d) for k, d in defaults.items()})
        values["plugin_config"] = {**(plugin_config or {}), **config.get("plugin_config", {})}
        return cls(**values)


# ----------------------------------------------------------------------------- models


MODEL_MAP: dict = {}


def _mapping(d):
    d = dict(d or {})
    return SimpleNamespace(world_size=d.get("world_size", 1), tp_size=d.get("tp_size", 1), pp_size=d.get("pp_size", 1),
                           rank=0, tp_group=None, tp_rank=0)


class PretrainedConfig:
    def __init__(self, *, architecture, dtype, hidden_size, num_hidden_layers, num_attention_heads, mapping=None,
                 quantization=None, logits_dtype="float32", norm_epsilon=1e-5, **kwargs):
        self.architecture, self.dtype, self.hidden_size = architecture, dtype, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.logits_dtype, self.norm_epsilon, self.mapping = logits_dtype, norm_epsilon, _mapping(mapping)
        q = dict(quantization or {})
        self.quantization = SimpleNamespace(quant_algo=q.get("quant_algo"),
                                            kv_cache_quant_algo=q.get("kv_cache_quant_algo"),
                                            exclude_modules=q.get("exclude_modules"))
        for k, v in kwargs.items():
            setattr(self, k, v)

    @classmethod
    def from_json_file(cls, path):
        cfg = json.loads(Path(path).read_text())
        return getattr(MODEL_MAP[cfg["architecture"]], "config_class", PretrainedConfig)(**cfg)

    def set_rank(self, rank):
        self.mapping.rank = rank


# tensorrt_llm/quantization/quantize.py quantize_layers: the exclusions when exclude_modules is None.
DEFAULT_EXCLUDED = ["*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                    "*shared_expert_gate", "*fused_a"]


def quantize(model, quantization):
    """quantize.py quantize() for the algorithms the engine path writes: FP8 replaces the linears
    quantize_layers would (fp8_quantize's map); kv_cache_quantize only touches upstream Attention
    classes, of which the stand-in has none (our drafter declares its own KV scales)."""
    algo = quantization.quant_algo
    if algo is None:
        return model
    if algo != "FP8":
        raise NotImplementedError(f"the stand-in quantizes FP8 only, not {algo} (tensorrt_llm/quantization/layers.py)")
    import fnmatch

    excluded = quantization.exclude_modules or DEFAULT_EXCLUDED
    for name, module, parent in list(model.named_modules_with_parent()):
        cls = {ColumnLinear: FP8Linear, RowLinear: FP8RowLinear}.get(type(module))
        if cls is None or parent is None or any(fnmatch.fnmatchcase(name, pat) for pat in excluded):
            continue
        parent._modules[name.rsplit(".", 1)[-1]] = cls(module.in_features, module.out_features,
                                                       bias=module.bias is not None, dtype=module.dtype)
    return model


def preprocess_weights(weights: dict, config) -> dict:
    """modeling_utils.py preprocess_weights for a non-mixed checkpoint: merge k / v cache scales into
    kv_cache_scaling_factor (their max) and add its reciprocal; FP8 views int8-stored weights as
    fp8 and drops the scales of an lm_head left unquantized."""
    weights = dict(weights)
    for name in [n for n in weights if n.endswith(".k_cache_scaling_factor")]:
        v = name.replace("k_cache_scaling_factor", "v_cache_scaling_factor")
        assert v in weights, f"{v} not found"
        weights[name.replace("k_cache_scaling_factor", "kv_cache_scaling_factor")] = torch.max(weights.pop(name),
                                                                                               weights.pop(v))
    for name in [n for n in weights if n.endswith(".kv_cache_scaling_factor")]:
        weights.setdefault(name.replace("kv_cache_scaling_factor", "kv_cache_rcp_scaling_factor"),
                           torch.reciprocal(weights[name]))
    algo = config.quantization.quant_algo
    if algo == "FP8":
        weights = {n: t.view(torch.float8_e4m3fn) if n.endswith("weight") and t.dtype == torch.int8 else t
                   for n, t in weights.items()}
        if "lm_head.weight" in weights and weights["lm_head.weight"].dtype != torch.float8_e4m3fn:
            weights.pop("lm_head.weights_scaling_factor", None)
            weights.pop("lm_head.activation_scaling_factor", None)
    elif algo is not None:
        raise NotImplementedError(f"the stand-in preprocesses FP8 checkpoints only, not {algo}")
    return weights


class _PostInitCaller(type):
    """modeling_utils.py PostInitCaller: __post_init__ runs after every construction."""

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj.__post_init__()
        return obj


class PretrainedModel(Module, metaclass=_PostInitCaller):
    """tensorrt_llm/models/modeling_utils.py PretrainedModel (TensorRT-LLM 1.2.x; stored copy
    NVIDIA/TensorRT-LLM@01ea6d79): __post_init__ quantizes, from_checkpoint preprocesses, load
    checks what is required (the module docstring gives each rule)."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def __post_init__(self):
        quantize(self, self.config.quantization)

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        from safetensors.torch import load_file

        if config is None:
            config = PretrainedConfig.from_json_file(f"{ckpt_dir}/config.json")
        if rank is not None:
            config.set_rank(rank)
        weights = load_file(f"{ckpt_dir}/rank{config.mapping.rank}.safetensors")
        if preprocess_weights_hook is not None:
            weights = preprocess_weights_hook(weights)
        weights = preprocess_weights(weights, config)
        model = cls(config)
        model.load(weights)
        return model

    def load(self, weights):
        params = dict(self.named_parameters())
        embedding = any(k.endswith("vocab_embedding.weight") for k in weights)
        required = {n for n, p in params.items() if not p.is_inited()}
        required -= {n for n in required if n.endswith("lm_head.weight") and embedding and n not in weights}
        if not required <= set(weights):
            raise RuntimeError(f"Required but not provided tensors:{required - set(weights)}")
        self.unused = sorted(set(weights) - required)  # upstream only warns ("Provided but not required tensors")
        for n, v in weights.items():
            if n in params:  # every provided parameter, initialised ones too
                params[n].value = v


class _StockLayer(Module):
    """A stand-in decoder layer (residual update from its own norm weight); returns
    (hidden, presents) with use_cache like the stock layers."""

    def __init__(self, config, idx):
        super().__init__()
        self.layer_idx = idx
        self.post_layernorm = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        # GatedMLP's down projection under its checkpoint name: loaded (and quantized) like the real
        # layer's, unused by the stand-in forward.
        self.mlp = Module()
        inter = getattr(config, "intermediate_size", 4 * config.hidden_size)
        self.mlp.proj = RowLinear(inter, config.hidden_size, bias=False, dtype=config.dtype)

    def forward(self, hidden, use_cache=False, **_):
        out = Tensor(t=hidden.t + torch.tanh(self.post_layernorm(hidden).t))
        return (out, None) if use_cache else out


class _Stock(PretrainedModel):
    """DecoderModelForCausalLM's contract: transformer.{vocab_embedding, layers, ln_f}, lm_head;
    forward marks `logits` (the last token of each sequence) and returns (lm_logits, hidden,
    all_hidden_states = the packed ln_f output)."""

    config_class = PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        self.transformer = Module()
        self.transformer.vocab_embedding = Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.transformer.layers = ModuleList([_StockLayer(config, i) for i in range(config.num_hidden_layers)])
        self.transformer.ln_f = RmsNorm(config.hidden_size, eps=config.norm_epsilon, dtype=config.dtype)
        self.lm_head = ColumnLinear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype)

    def forward(self, input_ids, position_ids=None, use_cache=False, last_token_ids=None, **_):
        h = self.transformer.vocab_embedding(input_ids)
        for i in range(len(self.transformer.layers)):
            h = self.transformer.layers[i](h, use_cache=use_cache)
            h = h[0] if use_cache else h
        final = self.transformer.ln_f(h)
        logits = self.lm_head(index_select(final, 0, last_token_ids - 1))
        logits.mark_output("logits", self.config.logits_dtype)
        return logits, h, final


class QWenForCausalLM(_Stock):
    pass


class LLaMAForCausalLM(_Stock):
    pass


class _AllReduceHelper:
    def __init__(self):
        self.calls = []

    def set_workspace_tensor(self, mapping, num_profiles=None):
        self.calls.append((mapping.tp_size, num_profiles))


HELPER = _AllReduceHelper()


def install(monkeypatch) -> Net:
    """Put the stand-ins in sys.modules (tensorrt, tensorrt_llm.*) and reload engines/ops_trtllm.py and
    engines/trtllm_models.py against them, with the plugins replaced by their torch reference."""
    global NET
    NET = Net()
    mods = {}

    def mod(name, **attrs):
        m = stand_in.module(name)
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    mods["tensorrt"] = fake_graph_rewriting.tensorrt(int32=torch.int32, float32=torch.float32, bfloat16=torch.bfloat16,
                                                     float16=torch.float16, fp8=torch.float8_e4m3fn)
    mods["tensorrt_llm.graph_rewriting"] = fake_graph_rewriting.graph_rewriting()
    functional = {n: globals()[n] for n in ("Tensor", "constant", "cast", "concat", "shape", "slice", "split",
                                            "unsqueeze", "cos", "sin", "silu", "maximum", "index_select", "argmax")}
    mod("tensorrt_llm")
    mod("tensorrt_llm.functional", **functional)
    mod("tensorrt_llm.layers", ColumnLinear=ColumnLinear, RowLinear=RowLinear, RmsNorm=RmsNorm, Embedding=Embedding)
    MODEL_MAP.clear()
    MODEL_MAP.update({"Qwen3ForCausalLM": QWenForCausalLM, "LlamaForCausalLM": LLaMAForCausalLM})
    mod("tensorrt_llm.models", MODEL_MAP=MODEL_MAP, QWenForCausalLM=QWenForCausalLM, LLaMAForCausalLM=LLaMAForCausalLM)
    mod("tensorrt_llm.models.modeling_utils", PretrainedConfig=PretrainedConfig, PretrainedModel=PretrainedModel)
    mod("tensorrt_llm.module", Module=Module, ModuleList=ModuleList)
    mod("tensorrt_llm.parameter", Parameter=Parameter)
    mod("tensorrt_llm.plugin", current_all_reduce_helper=lambda: HELPER)
    mod("tensorrt_llm._utils", str_dtype_to_torch=_dtype, str_dtype_to_trt=_dtype)
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    for name in ("trtllm_dflash.engines.ops_trtllm", "trtllm_dflash.engines.trtllm_models", "models"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    from trtllm_dflash.engines import ops_trtllm
    from trtllm_dflash.plugins.kv_inject_attention import append_context_reference, kv_inject_attention_reference

    def append(k_cache, v_cache, k_new, v_new, cache_lens, new_lens, *, k_scale=None, v_scale=None):
        NET.plugins.append("kv_append")
        lens = cache_lens.t.clone()
        scales = {} if k_scale is None else dict(k_scale=k_scale.t, v_scale=v_scale.t)
        append_context_reference(k_cache.t, v_cache.t, k_new.t, v_new.t, lens, new_lens.t, **scales)
        return k_cache, v_cache, Tensor(t=lens)  # written in place: the bound present = past buffer

    def attention(q, k, v, k_cache, v_cache, cache_lens, *, scale=None, causal_block=False, window=None, k_scale=None,
                  v_scale=None):
        NET.plugins.append("kv_inject_attention")
        scales = {} if k_scale is None else dict(k_scale=k_scale.t, v_scale=v_scale.t)
        return Tensor(t=kv_inject_attention_reference(q.t, k.t, v.t, k_cache.t, v_cache.t, cache_lens.t, scale=scale,
                                                      causal_block=causal_block, window=window, **scales))

    monkeypatch.setattr(ops_trtllm, "kv_append_trtllm", append)
    monkeypatch.setattr(ops_trtllm, "kv_inject_attention_trtllm", attention)
    return NET


def load_models_file(path: Path):
    """What trtllm-build does: SourceFileLoader('models', --model_cls_file).load_module()."""
    from importlib.machinery import SourceFileLoader

    return SourceFileLoader("models", str(path)).load_module()


def run(model, feed: dict, **prepare_kwargs) -> Net:
    """prepare_inputs(**prepare_kwargs) with `feed` as the input values, then forward."""
    NET.feed, NET.inputs, NET.outputs, NET.casts, NET.plugins = dict(feed), {}, {}, {}, []
    inputs = model.prepare_inputs(**prepare_kwargs)
    model(**inputs)
    return NET


__all__ = ["OrderedDict", "install", "load_models_file", "run"]
