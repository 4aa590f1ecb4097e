"""ArenaDrafter (runtime/drafter_runner.py), the runner of the drafter engine, on CPU: over the
engine contract run by torch (TorchDrafterSession) it drafts exactly what the torch drafter
network (EngineDrafter) drafts, round by round, with joins and cancels; it binds each arena
input and its present output to one buffer and refuses a non-contiguous or overflowing context."""

import pytest
import torch

from reference_helpers import make_drafter, make_target
from trtllm_dflash.formats.engine_io import arena_names
from trtllm_dflash.reference import load_pair
from trtllm_dflash.reference.runners import PAD
from trtllm_dflash.runtime.drafter_runner import ArenaDrafter, TorchDrafterSession
from trtllm_dflash.runtime.engine_runners import EngineModel, drafter_weights, engine_model_from_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafter-runner")
    t = make_target(root / "t", "qwen3", seed=3)
    return load_pair(t, make_drafter(root / "d", t, seed=4, block_size=8))


def arena_model(target, drafter, max_seq_len, sessions):  # noqa: D401
    """engine_model_from_pair with the drafter engine's runner in place of the torch network."""
    base = engine_model_from_pair(target, drafter, max_seq_len)
    d = drafter.cfg

    def factory(max_len):
        session = TorchDrafterSession(base.w, base.spec, base.rope, max_len=max_len)
        sessions.append(session)
        return ArenaDrafter(session, block_size=d.block_size, mask_token_id=d.mask_token_id,
                            target_layer_ids=tuple(d.target_layer_ids), max_len=max_len)

    return EngineModel(base.executor, None, d, vocab_size=target.cfg.vocab_size, eos_token_ids=target.cfg.eos_token_ids,
                       drafter_factory=factory)


def test_arena_drafter_drafts_what_the_torch_drafter_drafts(pair):
    """Ragged context appends, joins and keeps: the same draft logits (to fp32 rounding) every call."""
    from trtllm_dflash.runtime.engine_runners import EngineDrafter

    target, drafter = pair
    base = engine_model_from_pair(target, drafter, max_seq_len=64)
    d = drafter.cfg
    kw = dict(block_size=d.block_size, mask_token_id=d.mask_token_id, target_layer_ids=tuple(d.target_layer_ids),
              max_len=64)
    runners = [EngineDrafter(base.w, base.spec, base.rope, **kw),
               ArenaDrafter(TorchDrafterSession(base.w, base.spec, base.rope, max_len=64), **kw)]
    H, gen = base.w["dflash.fc.weight"].shape[0], torch.Generator().manual_seed(1)
    lens = []

    def call(new_rows, anchors, T):
        nonlocal lens
        n = max(new_rows)
        ctx = torch.randn(len(new_rows), n, H, generator=gen)
        pos = torch.tensor([[lens[b] + j if j < m else PAD for j in range(n)] for b, m in enumerate(new_rows)])
        start = torch.tensor([a + m for a, m in zip(lens, new_rows)])
        outs = [r.draft(torch.tensor(anchors), start, ctx, pos, T) for r in runners]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)  # GEMM paths may differ in the last bit
        assert torch.equal(outs[0].argmax(-1), outs[1].argmax(-1))
        lens = start.tolist()

    for r in runners:
        r.join(2)
    lens = [0, 0]
    call([5, 2], [3, 4], d.block_size)  # prefills of different lengths
    call([3, 1], [7, 8], d.block_size)  # ragged acceptance
    for r in runners:
        r.keep([1])
        r.join(1)
    lens = [lens[1], 0]
    call([2, 6], [9, 10], 4)  # a shorter block, a joined row's prefill
    call([1, 4], [11, 12], d.block_size)
    assert runners[1].lens == lens and runners[1].arena.lens.tolist() == runners[0].arena.lens.tolist()
    for layer in range(d.num_layers):
        for a, b in ((runners[0].arena.k[layer], runners[1].arena.k[layer]),
                     (runners[0].arena.v[layer], runners[1].arena.v[layer])):
            torch.testing.assert_close(a[:, : max(lens)], b[:, : max(lens)], rtol=1e-5, atol=1e-5)


def test_arena_inputs_and_present_outputs_share_buffers_and_bad_context_is_refused(pair):
    target, drafter = pair
    base = engine_model_from_pair(target, drafter, max_seq_len=32)
    seen = {}

    class Recording(TorchDrafterSession):
        def run(self, inputs, outputs):
            seen.update(inputs=dict(inputs), outputs=dict(outputs))
            super().run(inputs, outputs)

    d = drafter.cfg
    runner = ArenaDrafter(Recording(base.w, base.spec, base.rope, max_len=40), block_size=d.block_size,
                          mask_token_id=d.mask_token_id, target_layer_ids=tuple(d.target_layer_ids), max_len=40)
    runner.join(2)
    H = base.w["dflash.fc.weight"].shape[0]
    ctx, pos = torch.randn(2, 3, H), torch.tensor([[0, 1, 2], [0, 1, PAD]])
    logits = runner.draft(torch.tensor([5, 6]), torch.tensor([3, 2]), ctx, pos, 4)
    assert logits.shape == (2, 3, target.cfg.vocab_size) and runner.lens == [3, 2]
    for i, o in arena_names(d.num_layers):
        assert seen["inputs"][i] is seen["outputs"][o]
    assert seen["inputs"]["cache_lens"].tolist() == [0, 0] and seen["inputs"]["new_ctx_lens"].tolist() == [3, 2]
    assert seen["inputs"]["ctx_positions"].tolist() == [[0, 1, 2], [0, 1, 0]]  # padding clamped
    assert seen["inputs"]["block_positions"][:, 0].tolist() == [3, 2]
    with pytest.raises(RuntimeError, match="row 1: 2 cached \\+ 1 new context rows, but the anchor is at position 5"):
        runner.draft(torch.tensor([5, 6]), torch.tensor([4, 5]), ctx[:, :1], torch.tensor([[3], [2]]), 4)
    with pytest.raises(RuntimeError, match="41 context rows exceed the arena's 40"):
        runner.draft(torch.tensor([5, 6]), torch.tensor([41, 3]), torch.randn(2, 38, H),
                     torch.cat([torch.arange(3, 41)[None], torch.full((1, 38), PAD)]), 4)


def test_drafter_weights_need_no_copy_for_the_session(pair):
    target, drafter = pair
    w = drafter_weights(target, drafter)
    base = engine_model_from_pair(target, drafter, max_seq_len=16)
    s = TorchDrafterSession(w, base.spec, base.rope, max_len=16)
    assert (s.vocab_size, s.dtype, s.num_layers) == (
        target.cfg.vocab_size, w["lm_head.weight"].dtype, drafter.cfg.num_layers)
