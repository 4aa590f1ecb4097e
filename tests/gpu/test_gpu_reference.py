"""The reference backend on CUDA with the shipped tiny pair (and a tiny random Laguna drafter): DFlash and DDTree stay
lossless.

Greedy decoding in fp32 on the GPU: every mode must give the target's own greedy tokens
(exact equality; all modes run the same kernels in the same dtype, and the CPU tests check
the same property), and the trained drafter must accept drafts (tau > 1.5: the shipped
drafter reaches ~4 on CPU; a broken device path would accept ~nothing).
"""

import pytest
import torch

from trtllm_dflash.perf.bench_quant import shipped_pair
from trtllm_dflash.prompts.sources import heldout_token_prompts as heldout_prompts
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


def test_joins_leaves_and_tree_budgets_on_cuda(pair):
    """The KV cache's pool of batch entries (joins take free entries, leaves free theirs, reads
    gather rows) and DDTree rounds of any budget, chains and plain rounds, on CUDA: every request
    still gets the target's greedy tokens."""
    from trtllm_dflash.policy.decision import Drafts
    from trtllm_dflash.reference.generate import Decoder

    target, drafter = load_pair(*pair, torch.float32, device="cuda")
    prompts = heldout_prompts(pair[0], 6, 48)
    ar = [g.tokens for g in generate(target, None, prompts, 40, mode="ar", stop_token_ids=[])]
    for mode, schedule in (("dflash", [None, 0, 3, 7]), ("ddtree", [(None, None), (15, 8), (3, 0), (0, 0)])):
        decoder = Decoder(target, drafter, mode=mode, ddtree_budget=32, max_len=128)
        limits = [6, 40, 40, 40, 40, 40]  # request 0 leaves early: a later one takes its entry
        out = {i: [] for i in range(6)}
        for i, toks in zip(range(3), decoder.admit([0, 1, 2], prompts[:3], limits[:3], [[]] * 3).tokens):
            out[i] += toks
        k = 0
        while decoder.running:
            choice = schedule[k % len(schedule)]
            rec = decoder.step(Drafts.of(*choice) if isinstance(choice, tuple) else Drafts.of(choice))
            for r, toks in zip(rec.seq_ids, rec.tokens):
                out[r] += toks
            k += 1
            if k in (2, 5):  # requests join mid-flight, into the entries finished ones freed
                ids = [3, 4] if k == 2 else [5]
                for r, toks in zip(ids, decoder.admit(ids, [prompts[i] for i in ids], [limits[i] for i in ids],
                                                      [[]] * len(ids)).tokens):
                    out[r] += toks
        assert [out[i] for i in range(6)] == [t[:n] for t, n in zip(ar, limits)], mode


def test_a_laguna_drafter_on_cuda_drafts_what_it_drafts_on_cpu(tmp_path):
    """A tiny random Laguna drafter (feature norms, normed context, softplus head gates; sliding,
    causal) on CUDA: the drafter pass gives the CPU's draft logits (fp32, 1e-4: other kernels, the
    same math) and greedy decoding gives the target's tokens."""
    from checkpoints import LAGUNA, make_drafter, make_target
    from trtllm_dflash.reference.runners import ReferenceDrafter

    t_dir, d_dir = make_target(tmp_path / "t"), make_drafter(tmp_path / "d", **LAGUNA)
    outs = {}
    for device in ("cpu", "cuda"):
        target, drafter = load_pair(t_dir, d_dir, torch.float32, device=device)
        assert drafter.cfg.laguna
        runner = ReferenceDrafter(drafter, target, cache_len=64)
        runner.join(2)
        g = torch.Generator().manual_seed(0)
        ctx = torch.randn(2, 6, 2 * 64, generator=g).to(device)  # [B, Tc, n*H] target features
        pos = torch.arange(6, device=device).expand(2, -1)
        anchor = torch.tensor([5, 9], device=device)
        outs[device] = runner.draft(anchor, torch.tensor([6, 6], device=device), ctx, pos, 8).cpu()  # [B, 7, V]
        prompts = [[5, 9, 2, 77, 31, 4, 4, 18], [8, 8, 100, 3]]
        ar = generate(target, None, prompts, 24, mode="ar", stop_token_ids=[])
        got = generate(target, drafter, prompts, 24, mode="dflash", stop_token_ids=[])
        assert [x.tokens for x in got] == [x.tokens for x in ar], device
    torch.testing.assert_close(outs["cuda"], outs["cpu"], rtol=1e-4, atol=1e-4)
