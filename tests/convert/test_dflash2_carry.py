"""convert and quantize carry DFlash2 drafters (convolutions and selector), and the reference
backend serves what they wrote; backends that cannot run DFlash2 yet refuse it at convert."""

import pytest
import torch
from safetensors.torch import load_file

from checkpoints import DFLASH2, converted, make_drafter, read_config, step_tokens, write_recipe
from trtllm_dflash.convert.convert import convert
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.reference import generate, load_pair
from trtllm_dflash.runtime.checkpoint import load_rank, read_checkpoint
from trtllm_dflash.runtime.checkpoint_runner import checkpoint_steps
from trtllm_dflash.runtime.tp_layers import Comm

PROMPTS = [[5, 9, 2, 77, 31], [8, 8, 100, 3]]
EXTRA = [f"layers.{i}.{c}.{w}" for i in range(2) for c in ("attention_conv", "mlp_conv")
         for w in ("base_kernel", "kernel_projection.weight")]
SELECTOR = [f"candidate_selector.{w}"
            for w in ("predecessor_codebook", "successor_codebook", "hidden_projection.weight")]


def _dst(name: str) -> str:
    return name.replace("layers.", "transformer.layers.") if name.startswith("layers.") else \
        name.replace("candidate_selector.", "dflash2.selector.")


@pytest.fixture(scope="module")
def pair2(tmp_path_factory, tiny_pair):
    d = make_drafter(tmp_path_factory.mktemp("dflash2") / "d", **DFLASH2)
    return tiny_pair[0], d


def test_convert_replicates_dflash2_tensors_and_the_reference_backend_serves_them(tmp_path, pair2):
    target, drafter = pair2
    src = load_file(drafter / "model.safetensors")
    out = convert(load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, tp=2)), tmp_path / "c2",
                  progress=False)
    assert read_config(out / "drafter")["hf_config"]["dflash_config"]["selector_top_k"] == 8
    for rank in range(2):
        shard = load_file(out / "drafter" / f"rank{rank}.safetensors")
        for name in EXTRA + SELECTOR:  # every rank holds all of them, unchanged
            assert torch.equal(shard[_dst(name)], src[name]), name
    one = convert(load_recipe(write_recipe(tmp_path / "r1.yaml", target, drafter, tp=1)), tmp_path / "c1",
                  progress=False)
    t_mem, d_mem = load_pair(target, drafter)
    expect = [g.tokens for g in generate(t_mem, None, PROMPTS, 20, mode="ar", stop_token_ids=[])]
    _, d_ckpt = load_rank(read_checkpoint(one), Comm())
    assert d_ckpt.candidate_selector is not None
    for name, p in d_mem.state_dict().items():
        assert torch.equal(d_ckpt.state_dict()[name], p), name
    assert step_tokens(checkpoint_steps(one, PROMPTS, 20, mode="dflash", stop_token_ids=[]), 2) == expect


def test_quantize_keeps_dflash2_parameters_in_the_drafter_dtype(tmp_path, pair2):
    pytest.importorskip("modelopt.torch.quantization",
                        reason="nvidia-modelopt not installed (pip install 'trtllm_dflash[quant]')")
    from trtllm_dflash.quantize.stage import quantize

    target, drafter = pair2
    src = load_file(drafter / "model.safetensors")
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, tp=1, fmt="fp8", drafter_fmt="fp8"))
    out = quantize(recipe, converted(recipe, tmp_path / "c"), tmp_path / "q", samples=2, length=16, progress=False)
    shard = load_file(out / "drafter" / "rank0.safetensors")
    assert shard["transformer.layers.0.attention.q.weight"].dtype == torch.float8_e4m3fn  # the GEMMs are FP8
    for name in EXTRA + SELECTOR:
        assert torch.equal(shard[_dst(name)], src[name]), name  # float32, untouched
        assert not any(k.startswith(_dst(name).removesuffix(".weight") + ".") and "scaling" in k for k in shard)
    tq, dq = load_rank(read_checkpoint(out), Comm())  # what the reference backend serves from it
    assert dq.candidate_selector is not None
    ar = [g.tokens for g in generate(tq, None, PROMPTS, 16, mode="ar", stop_token_ids=[])]
    assert [g.tokens for g in generate(tq, dq, PROMPTS, 16, stop_token_ids=[])] == ar


@pytest.mark.parametrize("backend", ["engine", "pytorch"])
def test_backends_without_dflash2_refuse_it_at_convert(tmp_path, pair2, backend):
    target, drafter = pair2
    gpu = "h100-sxm" if backend != "reference" else "cpu"
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", target, drafter, gpu=gpu, fmt="bf16", backend=backend),
                         check_rules=False)
    with pytest.raises(UserError, match=f"conv_kernel_size is set and backend.name is {backend}: "):
        convert(recipe, tmp_path / "out", progress=False)
