"""engines/trtllm_models.py and engines/ops_trtllm.py (GPU-only code) run on CPU against a torch-backed
stand-in of TensorRT-LLM's functional API, layers and model base classes (tests/helpers/
fake_trtllm.py), loaded the way trtllm-build loads them (SourceFileLoader('models', file)):

- the drafter class registers in MODEL_MAP, loads the convert stage's drafter checkpoint, declares
  exactly the build plan's inputs (names, dtypes, dims) and marks exactly its outputs, and its
  network (networks.drafter_forward over TrtllmOps) drafts what the torch network drafts, through
  the drafter runner (present outputs written into the bound arena);
- the target classes tap the right layers, take the tap weights from the drafter checkpoint,
  keep the tap out of quantization, and mark dflash_ctx / _tail / _logits / _argmax by the
  engine_io row rule.
What this cannot check: TensorRT itself (shapes are concrete here, layers run eagerly) and
TensorRT-LLM's real layer internals; docs/gpu.md lists the GPU checks.
"""

from pathlib import Path

import pytest
import torch

import fake_graph_rewriting
import fake_trtllm
from trtllm_dflash.engines.plan import make_plan, models_file
from trtllm_dflash.formats import engine_io
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.reference.runners import PAD
from trtllm_dflash.reference.target import Rope
from trtllm_dflash.runtime.drafter_runner import ArenaDrafter, TorchDrafterSession
from trtllm_dflash.runtime.networks import DrafterSpec, target_tap
from trtllm_dflash.runtime.ops_torch import TorchOps

ROOT = Path(__file__).resolve().parents[2]
# trtllm-build itself loads the file with the deprecated SourceFileLoader.load_module.
pytestmark = pytest.mark.filterwarnings("ignore:the load_module\\(\\) method is deprecated:DeprecationWarning")
TINY = ROOT / "recipes/cpu/tiny-pystd-engine.yaml"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from trtllm_dflash.convert.convert import convert

    return convert(load_recipe(TINY), tmp_path_factory.mktemp("conv") / "convert", progress=False)


class FakeEngineSession:
    """The drafter 'engine' = the network built by DFlashDrafter, evaluated by the stand-in."""

    def __init__(self, model, torch_session, limits):
        self.model, self.limits, self.calls = model, limits, []
        for attr in ("num_layers", "num_kv_heads", "head_dim", "vocab_size", "dtype", "kv_dtype", "device", "max_len"):
            setattr(self, attr, getattr(torch_session, attr))

    def run(self, inputs, outputs):
        net = fake_trtllm.run(self.model, inputs, **self.limits)
        self.calls.append(net)
        assert set(net.outputs) == set(outputs) and not any(net.casts[n] for n in outputs if n.startswith("present_"))
        for name, t in outputs.items():
            if name.startswith("present_"):
                assert net.outputs[name] is inputs[name.removeprefix("present_")]  # written in place
            else:
                t.copy_(net.outputs[name])


def _drafter(converted, monkeypatch):
    fake_trtllm.install(monkeypatch)
    models = fake_trtllm.load_models_file(models_file())
    assert fake_trtllm.MODEL_MAP["DFlashDrafter"] is models.DFlashDrafter
    config = fake_trtllm.PretrainedConfig.from_json_file(converted / "drafter" / "config.json")
    assert type(config) is models.DFlashDrafterConfig and config.dflash["block_size"] == 16
    return models, models.DFlashDrafter.from_checkpoint(str(converted / "drafter"), config=config)


def test_drafter_network_drafts_what_the_torch_network_drafts(converted, monkeypatch):
    from trtllm_dflash.runtime.checkpoint import read_checkpoint, read_rank

    models, model = _drafter(converted, monkeypatch)
    assert model.unused == []  # every checkpoint tensor but the target's dflash.* is a parameter
    info = read_checkpoint(converted)
    d = info.drafter_cfg
    torch_session = TorchDrafterSession(read_rank(info, "drafter", 0, torch.float32), DrafterSpec.from_config(d),
                                        Rope(d.rope, d.head_dim), max_len=64)
    recipe = load_recipe(TINY)
    plan = make_plan(recipe, None, Path("/nonexistent")).engine("drafter")
    limits = dict(max_batch_size=plan.build_config["max_batch_size"], max_input_len=plan.build_config["max_input_len"],
                  max_seq_len=plan.build_config["max_seq_len"], max_draft_len=plan.build_config["max_draft_len"],
                  use_cache=True, max_beam_width=1, max_num_tokens=plan.build_config["max_num_tokens"])
    engine = FakeEngineSession(model, torch_session, limits)
    kw = dict(block_size=d.block_size, mask_token_id=d.mask_token_id, target_layer_ids=tuple(d.target_layer_ids),
              max_len=64)
    runners = [ArenaDrafter(torch_session, **kw), ArenaDrafter(engine, **kw)]
    H, gen, lens = d.hidden_size, torch.Generator().manual_seed(0), [0, 0]
    for r in runners:
        r.join(2)
    for new_rows, T in (([6, 3], 16), ([2, 5], 16), ([1, 1], 8)):
        n = max(new_rows)
        ctx = torch.randn(2, n, H, generator=gen)
        pos = torch.tensor([[lens[b] + j if j < m else PAD for j in range(n)] for b, m in enumerate(new_rows)])
        start = torch.tensor([a + m for a, m in zip(lens, new_rows)])
        outs = [r.draft(torch.tensor([7, 9]), start, ctx, pos, T) for r in runners]
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(engine.calls[-1].outputs["draft_ids"].long(), outs[0].argmax(-1))
        lens = start.tolist()
    for layer in range(d.num_layers):
        torch.testing.assert_close(runners[1].arena.k[layer][:, :9], runners[0].arena.k[layer][:, :9])

    # The engine's interface is the build plan's: inputs (names, dtypes, dims) and outputs.
    net = engine.calls[0]
    layers = [str(i) for i in range(d.num_layers)]

    def expand(tensors):
        return [t.name.replace("{l}", layer) for t in tensors for layer in (layers if "{l}" in t.name else [""])]

    assert sorted(net.inputs) == sorted(expand(plan.inputs))
    assert sorted(net.outputs) == sorted(expand(plan.outputs))
    for t in plan.inputs:
        got = net.inputs[t.name.replace("{l}", "0")]
        assert got["dims"] == list(t.shape) and str(got["dtype"]).removeprefix("torch.") == t.dtype, t.name
    assert net.plugins == ["kv_append", "kv_inject_attention"] * d.num_layers


def test_target_tap_marks_the_dflash_outputs_by_the_row_rule(converted, monkeypatch):
    fake_trtllm.install(monkeypatch)
    models = fake_trtllm.load_models_file(models_file())
    config = fake_trtllm.PretrainedConfig.from_json_file(converted / "target" / "config.json")
    model = models.DFlashQwen3Target.from_checkpoint(str(converted / "target"), config=config)
    dflash = engine_io.read_drafter_config(converted / "target")["dflash"]
    assert model.tap_layer_ids == tuple(dflash["target_layer_ids"]) and model.tail == dflash["block_size"] == 16
    assert "dflash.fc.weight" not in model.unused and model.config.dflash == dflash  # lands in the engine's config.json

    lengths = [5, 23, 1]
    ids = torch.randint(0, config.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(2),
                        dtype=torch.int32)
    last = torch.tensor(lengths).cumsum(0).to(torch.int32)
    net = fake_trtllm.NET
    net.outputs.clear()
    model(input_ids=fake_trtllm.Tensor(t=ids), last_token_ids=fake_trtllm.Tensor(t=last), use_cache=True)

    # Independently: the stand-in's layers in torch, the tap with TorchOps, the rows by engine_io.tail_rows.
    w = dict((n, p.raw) for n, p in model.named_parameters())
    h, taps = w["transformer.vocab_embedding.weight"][ids.long()], {}
    eps = config.norm_epsilon
    for i in range(config.num_hidden_layers):
        norm = w[f"transformer.layers.{i}.post_layernorm.weight"]
        h = h + torch.tanh(norm * torch.nn.functional.rms_norm(h.float(), norm.shape, eps=eps).to(h.dtype))
        taps[i] = h
    tap = engine_io.tap_weights(converted / "target", 0, torch.float32)
    ctx = target_tap(TorchOps(tap), [torch.cat([taps[i] for i in model.tap_layer_ids], -1)], eps)
    rows = engine_io.tail_rows(last, 16)
    final = w["transformer.ln_f.weight"] * torch.nn.functional.rms_norm(h, h.shape[-1:], eps=eps)
    logits = torch.nn.functional.linear(final[rows], w["lm_head.weight"])
    out = net.outputs
    torch.testing.assert_close(out["dflash_ctx"], ctx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["dflash_tail"], ctx[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["dflash_logits"], logits, rtol=1e-5, atol=1e-5)
    assert out["dflash_logits"].dtype == torch.float32 and out["dflash_argmax"].dtype == torch.int32
    assert torch.equal(out["dflash_argmax"].long(), out["dflash_logits"].argmax(-1))
    assert out["dflash_tail"].shape == (3, 16, config.hidden_size)


def _fp8_copy(converted: Path, dst: Path, role: str, exclude_modules, weights: bool = True) -> Path:
    """`role`'s checkpoint re-saved as quantize writes it for an FP8 KV cache (k / v cache scales per
    layer, kv_cache_quant_algo FP8) and, with `weights`, FP8 weights (the stock layers' mlp.proj in
    fp8 with per-tensor weight and activation scales; quant_algo FP8 with `exclude_modules`)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    out = dst / role
    shutil.copytree(converted / role, out)
    w = load_file(out / "rank0.safetensors")
    for name in [n for n in w if n.endswith("mlp.proj.weight") and n.startswith("transformer.layers.")]:
        if weights:
            scale = w[name].abs().max().reshape(1) / 448
            w[name] = (w[name] / scale).to(torch.float8_e4m3fn)
            w[name.replace("weight", "weights_scaling_factor")] = scale
            w[name.replace("weight", "activation_scaling_factor")] = torch.ones(1)
        layer = name.removesuffix("mlp.proj.weight")
        w[layer + "attention.k_cache_scaling_factor"], w[layer + "attention.v_cache_scaling_factor"] = \
            torch.tensor([0.5]), torch.tensor([2.0])
    save_file(w, out / "rank0.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization"] = {"quant_algo": "FP8" if weights else None, "kv_cache_quant_algo": "FP8",
                           "exclude_modules": exclude_modules}
    (out / "config.json").write_text(json.dumps(cfg))
    if role == "target":  # the target reads its tap from the drafter checkpoint beside it
        shutil.copytree(converted / "drafter", dst / "drafter")
    return out


@pytest.mark.parametrize("given", [["lm_head"], None], ids=["given", "default"])
def test_target_tap_is_kept_out_of_quantization(converted, monkeypatch, tmp_path, given):
    """PretrainedModel quantizes after __init__ (__post_init__, modeling_utils.py): the stock
    linears become FP8 layers loading the checkpoint's fp8 weights and scales, while `dflash.*`
    (added to exclude_modules) and the excluded lm_head stay in the model dtype. The stand-in
    used to quantize nothing, so an FP8 config over float weights loaded there and nowhere else."""
    fake_trtllm.install(monkeypatch)
    models = fake_trtllm.load_models_file(models_file())
    ckpt = _fp8_copy(converted, tmp_path, "target", given)
    model = models.DFlashLlamaTarget.from_checkpoint(str(ckpt))
    excluded = model.config.quantization.exclude_modules
    assert excluded[-1] == "dflash.*" and all(k in excluded for k in (given or ["*lm_head", "*router"]))
    proj = model.transformer.layers[0].mlp.proj
    assert type(proj) is fake_trtllm.FP8RowLinear and proj.weight.raw.dtype == torch.float8_e4m3fn
    assert type(model.dflash.fc) is fake_trtllm.ColumnLinear and model.dflash.fc.weight.raw.dtype == torch.float32
    assert type(model.lm_head) is fake_trtllm.ColumnLinear
    assert not [n for n in model.unused if "mlp.proj" in n]  # the fp8 weights and their scales were all taken
    # An FP8 config over the float checkpoint is refused, as upstream's load refuses it.
    config = fake_trtllm.PretrainedConfig.from_json_file(converted / "target" / "config.json")
    config.quantization.quant_algo = "FP8"
    with pytest.raises(RuntimeError, match="Required but not provided tensors.*weights_scaling_factor"):
        models.DFlashLlamaTarget.from_checkpoint(str(converted / "target"), config=config)
    config = fake_trtllm.PretrainedConfig.from_json_file(converted / "target" / "config.json")
    with pytest.raises(ValueError, match="no `dflash` section"):
        models.DFlashQwen3Target(config)


def test_fp8_arena_scales_come_from_preprocess_weights(converted, monkeypatch, tmp_path):
    """preprocess_weights (modeling_utils.py) merges each layer's k / v cache scales into
    kv_cache_scaling_factor = max(k, v) and adds its reciprocal: the drafter's FP8-arena parameters
    load from what quantize writes (the stand-in used to skip preprocess_weights)."""
    fake_trtllm.install(monkeypatch)
    models = fake_trtllm.load_models_file(models_file())
    ckpt = _fp8_copy(converted, tmp_path, "drafter", None, weights=False)  # the shipped recipes' bf16 drafter
    model = models.DFlashDrafter.from_checkpoint(str(ckpt))
    att = model.transformer.layers[0].attention
    assert model.fp8_arena and att.kv_cache_scaling_factor.raw.item() == 2.0
    assert att.kv_cache_rcp_scaling_factor.raw.item() == 0.5
    assert type(model.transformer.layers[0].mlp.proj) is fake_trtllm.RowLinear and model.unused == []


def test_classes_pickle_under_the_package_name(monkeypatch):
    """trtllm-build --workers > 1 pickles the model class into spawned processes (commands/build.py
    parallel_build); loaded as module "models", the classes must resolve under the package name."""
    import pickle
    import sys

    fake_trtllm.install(monkeypatch)
    monkeypatch.delitem(sys.modules, "trtllm_dflash.engines.trtllm_models", raising=False)
    models = fake_trtllm.load_models_file(models_file())
    for cls in (models.DFlashDrafter, models.DFlashQwen3Target, models.DFlashDrafterConfig):
        assert cls.__module__ == "trtllm_dflash.engines.trtllm_models"
        assert pickle.loads(pickle.dumps(cls)) is cls


def test_the_drafter_network_passes_the_graph_rewriting_that_build_runs(converted, monkeypatch):
    """tensorrt_llm/builder.py build() -> graph_rewriting.optimize(network) asks every layer's
    as_layer(); upstream's map has no PLUGIN_V3 (the AOT plugin layers' type), so the drafter's
    network failed there until trtllm_models.py added the entry (tests/helpers/fake_graph_rewriting.py
    mirrors the upstream file; the real module is used where it imports)."""
    import sys

    models, model = _drafter(converted, monkeypatch)  # loads engines/trtllm_models.py as trtllm-build does
    trt, rewriting = sys.modules["tensorrt"], sys.modules["tensorrt_llm.graph_rewriting"]
    # The drafter's layers as TensorRT holds them: per draft layer the append and attention plugin
    # layers (add_plugin(..., aot=True): IPluginV3Layer), among ordinary ones.
    ordinary = [trt.IConstantLayer(trt.LayerType.CONSTANT), trt.IMatrixMultiplyLayer(trt.LayerType.MATRIX_MULTIPLY)]
    plugins = [trt.IPluginV3Layer(trt.LayerType.PLUGIN_V3) for _ in range(2 * model.spec.num_layers)]
    network = type("Network", (), {"layers": ordinary + plugins})()
    rewriting.optimize(network)  # with trtllm_models loaded: passes
    with pytest.raises(NotImplementedError, match="Unknown layer type: LayerType.PLUGIN_V3"):
        fake_graph_rewriting.graph_rewriting().optimize(network)  # the map as upstream ships it
