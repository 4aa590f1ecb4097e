"""The AR draft model of the HF assisted-generation baseline."""

import pytest
import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.train.ar_draft import build_from_target, next_token_loss
from trtllm_dflash.train.target import TargetModelConfig, build_model

TINY = TargetModelConfig(vocab_size=128, hidden_size=64, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=32,
                         intermediate_size=128, max_position_embeddings=64)


def test_starts_as_the_truncated_target():
    target = build_model(TINY, seed=0).eval()
    draft = build_from_target(target, 1)
    assert draft.config.num_hidden_layers == 1 and len(draft.model.layers) == 1
    t, d = target.state_dict(), draft.state_dict()
    for k in d:
        torch.testing.assert_close(d[k], t[k], rtol=0, atol=0)  # embedding, layer 0, final norm, tied head
    assert draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()
    with pytest.raises(UserError, match="expected 1..3"):
        build_from_target(target, 4)


def test_loss_counts_only_generated_labels():
    torch.manual_seed(0)
    model = build_model(TINY, seed=0).eval()
    ids = torch.randint(2, 128, (2, 10))
    mask = torch.zeros(2, 10)
    mask[:, 6:] = 1  # labels at positions 6..9 are predicted from positions 5..8
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits
        ce = torch.nn.functional.cross_entropy(logits[:, 5:].reshape(-1, 128), ids[:, 6:].reshape(-1))
        # fp32 on both sides; only the reduction order differs
        torch.testing.assert_close(next_token_loss(model, ids, mask, bf16=False), ce, rtol=1e-5, atol=1e-5)
