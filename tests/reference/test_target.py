"""The flat target forward against HF transformers: logits and captured hidden states.

Tolerance: fp32 throughout; the two implementations run the same ops in the same order
except SDPA masking and MoE accumulation order, so they agree to ~1e-7. We assert
rtol = atol = 1e-5 (fp32 round-off over a few layers, with margin).
"""

import json

import pytest
import torch

from reference_helpers import hf_model, make_target
from trtllm_dflash.reference import load_target

TOL = dict(rtol=1e-5, atol=1e-5)


def _causal(T, start=0, kv_len=None):
    kv_len = kv_len or start + T
    return (torch.arange(kv_len)[None, :] <= start + torch.arange(T)[:, None])[None, None]


def _check_full_forward(directory, T=40):
    hf, ours = hf_model(directory), load_target(directory)
    ids = torch.randint(0, ours.cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        cache = ours.new_cache(2, 64)
        pos = torch.arange(T).expand(2, -1)
        capture = tuple(range(ours.cfg.num_layers))
        logits, feats = ours(ids, pos, cache, T, _causal(T).expand(2, -1, -1, -1), capture)
    torch.testing.assert_close(logits, ref.logits, **TOL)
    H = ours.cfg.hidden_size
    for i in capture:  # layer i's output is HF hidden_states[i + 1] (the last one normed)
        torch.testing.assert_close(feats[..., i * H : (i + 1) * H], ref.hidden_states[i + 1], **TOL)
    return hf, ours


@pytest.mark.parametrize(
    "arch,kw",
    [
        ("qwen3", {}),
        ("qwen3", {"tie_word_embeddings": True}),
        ("llama", {}),  # llama3 rope scaling; positions go past original_max_position_embeddings
        ("qwen3_moe", {"norm_topk_prob": True}),
        ("qwen3_moe", {"norm_topk_prob": False, "decoder_sparse_step": 2, "mlp_only_layers": [0]}),
    ],
)
def test_forward_matches_hf(tmp_path, arch, kw):
    _check_full_forward(make_target(tmp_path, arch, **kw), T=40)


def test_tied_checkpoint_has_no_lm_head(tmp_path):
    d = make_target(tmp_path, "qwen3", tie_word_embeddings=True)
    ours = load_target(d)
    assert ours.lm_head.weight is ours.embed_tokens.weight


def test_sharded_checkpoint(tmp_path):
    d = make_target(tmp_path, "qwen3", sharded=True)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    _check_full_forward(d, T=8)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen3_moe"])
def test_incremental_blocks_match_full_forward(tmp_path, arch):
    """Prefill, then a 4-token block, a rejected block overwritten by a 1-token step, and a
    tree-shaped pass: the cache writes, positions and masks must reproduce HF's one-shot
    forward over the committed sequence."""
    d = make_target(tmp_path, arch)
    hf, ours = hf_model(d), load_target(d)
    seq = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(seq).logits[0]  # [12, V]
        cache = ours.new_cache(1, 32)
        out = []
        logits, _ = ours(seq[:, :5], torch.arange(5)[None], cache, 5, _causal(5))
        out.append(logits[0])
        logits, _ = ours(seq[:, 5:9], torch.arange(5, 9)[None], cache, 9, _causal(4, 5))
        out.append(logits[0])
        # a block of junk at positions 9..11 (as if rejected), then the true token at 9 alone
        junk = torch.tensor([[3, 4, 5]])
        ours(junk, torch.arange(9, 12)[None], cache, 12, _causal(3, 9))
        logits, _ = ours(seq[:, 9:10], torch.tensor([[9]]), cache, 10, None)
        out.append(logits[0])
        # tree: root = token 10 at slot 10, two children at depth 1 (slots 11, 12); the
        # second child is the true token 11; it sees slots < 10, the root and itself.
        ids = torch.tensor([[seq[0, 10], 7, seq[0, 11]]])
        vis = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        mask = torch.cat([torch.ones(3, 10, dtype=torch.bool), vis], 1)[None, None]
        logits, _ = ours(ids, torch.tensor([[10, 11, 11]]), cache, 13, mask, slots=torch.tensor([[10, 11, 12]]))
        out += [logits[0, :1], logits[0, 2:]]
    torch.testing.assert_close(torch.cat(out), ref, **TOL)


def test_legacy_llama31_rope_config():
    """A transformers-4.x Llama 3.1 config.json (rope_theta + rope_scaling) gives HF's
    llama3 inverse frequencies."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from trtllm_dflash.reference import TargetConfig

    raw = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
           "max_position_embeddings": 131072, "eos_token_id": [128001, 128008, 128009],
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    cfg = TargetConfig.from_dict(raw)
    assert cfg.head_dim == 128 and cfg.eos_token_ids == (128001, 128008, 128009) and not cfg.qk_norm
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"}), "cpu")
    torch.testing.assert_close(cfg.rope.inv_freq(128), ref, rtol=0, atol=0)


def test_loading_a_pair_computes_nothing_on_the_meta_device(tiny_pair):
    """The loaders build skeletons under torch.device("meta") and then load every tensor: an init or
    a RoPE table computed there runs torch._refs, whose first use imports torch._dynamo (about 2 s
    of every server's start-up)."""
    import subprocess
    import sys

    code = ("import sys; from trtllm_dflash.reference import load_pair; load_pair(sys.argv[1], sys.argv[2]); "
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, *map(str, tiny_pair)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
