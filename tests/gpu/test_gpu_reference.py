"""The reference backend on CUDA with the shipped tiny pair: DFlash and DDTree stay lossless.

Greedy decoding in fp32 on the GPU: every mode must give the target's own greedy tokens
(exact equality; all modes run the same kernels in the same dtype, and the CPU tests check
the same property), and the trained drafter must accept drafts (tau > 1.5: the shipped
drafter reaches ~4 on CPU; a broken device path would accept ~nothing).
"""

import pytest
import torch

from trtllm_dflash.prompts.sources import heldout_token_prompts as heldout_prompts
from trtllm_dflash.perf.bench_quant import shipped_pair
from trtllm_dflash.reference import generate, load_pair, pooled_tau

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair():
    dirs = shipped_pair()
    if dirs is None:
        pytest.skip("the shipped tiny-pystd pair is not installed")
    return dirs


def test_modes_are_lossless_on_cuda(pair):
    target, drafter = load_pair(*pair, torch.float32, device="cuda")
    prompts = heldout_prompts(pair[0], 4, 64)
    ar = generate(target, None, prompts, 64, mode="ar", stop_token_ids=[])
    for mode in ("dflash", "ddtree"):
        out = generate(target, drafter, prompts, 64, mode=mode, stop_token_ids=[])
        assert [g.tokens for g in out] == [g.tokens for g in ar], mode
        tau = pooled_tau(out)
        assert tau > 1.5, f"{mode}: tau {tau:.2f}"
