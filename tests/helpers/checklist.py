"""The first-GPU checklist's shared pieces (tests/gpu): its recipe, the skip without TensorRT-LLM,
the timings it records. The recipe is the shipped tiny engine recipe built in bf16. The shipped recipe is fp32 for exact
CPU emulation, but an fp32 target engine has no fused context attention (attentionOp.cpp falls back to unfused MHA),
hence no paged context FMHA and no KV block reuse (recipe/plan/engine_layout.py), which checklist item 1
measures. tests/build checks on CPU that this recipe's plan keeps reuse on."""

import json
import os
from pathlib import Path

import pytest

from trtllm_dflash.engines.stage import cannot_build_here
from trtllm_dflash.recipe import Recipe, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes/cpu/tiny-pystd-engine.yaml"
BF16 = ["quantization.target_weights=bf16", "quantization.activations=bf16", "quantization.kv_cache=bf16",
        "quantization.drafter=bf16"]


def checklist_recipe() -> Recipe:
    return load_recipe(TINY, BF16)


WHY_NOT = cannot_build_here()
needs_trtllm = pytest.mark.skipif(
    WHY_NOT is not None,
    reason=f"{WHY_NOT}: the first-GPU checklist's items 1-4 (docs/design/engine-path.md) build and run TensorRT-LLM "
                                "1.2.x engines; run them inside NVIDIA's Triton 26.07 trtllm-python-py3 container "
                                "(docs/gpu.md)")
TIMINGS: dict = {}


def record(key, value):
    """A timing or count for $OUT/checklist.json (docs/gpu.md)."""
    TIMINGS[key] = value
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "checklist.json").write_text(json.dumps(TIMINGS, indent=1))


def drafts_like_the_torch_network(info, build_out: Path, tol: dict) -> float:
    """A built drafter engine (TrtSession over build_out/drafter/engines) and the torch drafter
    network on the same checkpoint draft two ragged rows alike (within `tol`); returns the argmax
    agreement. Both arenas grow by the rows' new context."""
    import torch

    from trtllm_dflash.reference.runners import PAD
    from trtllm_dflash.reference.target import Rope
    from trtllm_dflash.runtime.checkpoint import read_rank
    from trtllm_dflash.runtime.drafter_runner import ArenaDrafter, TorchDrafterSession
    from trtllm_dflash.runtime.networks import DrafterSpec
    from trtllm_dflash.runtime.trt_runners import TrtSession

    session = TrtSession(build_out / "drafter" / "engines", "cuda")
    d = info.drafter_cfg
    torch_session = TorchDrafterSession(read_rank(info, "drafter", 0, torch.float32, "cuda"),
                                        DrafterSpec.from_config(d),
                                        Rope(d.rope, d.head_dim).to("cuda"), max_len=128)
    kw = dict(block_size=d.block_size, mask_token_id=d.mask_token_id, target_layer_ids=tuple(d.target_layer_ids),
              max_len=128)
    runners = [ArenaDrafter(session, **kw), ArenaDrafter(torch_session, **kw)]
    for r in runners:
        r.join(2)
    g = torch.Generator().manual_seed(3)
    ctx = torch.randn(2, 20, d.hidden_size, generator=g)
    pos = torch.tensor([list(range(20)), list(range(7)) + [PAD] * 13])
    outs = [r.draft(torch.tensor([3, 4]), torch.tensor([20, 7]), ctx, pos, d.block_size) for r in runners]
    torch.testing.assert_close(outs[0].float(), outs[1].float(), **tol)  # bf16 engine, fp32 torch network
    assert runners[0].arena.lens.tolist() == [20, 7]
    return (outs[0].argmax(-1) == outs[1].argmax(-1)).float().mean().item()
