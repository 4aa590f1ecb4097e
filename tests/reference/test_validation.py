"""Broken inputs fail before any work, with a message naming the file, the field or
tensor, the bad value and what is allowed."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference import Target, generate, load_drafter, load_pair, load_target


@pytest.fixture
def pair(tmp_path, qwen3_pair):
    """Private copies of the session pair that a test may break."""
    t, d = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(qwen3_pair[0], t)
    shutil.copytree(qwen3_pair[1], d)
    return t, d


def edit_json(path, **changes):
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            cfg[outer][inner] = value
        elif value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def edit_tensors(path, drop=(), replace=None):
    state = load_file(path)
    for name in drop:
        del state[name]
    state.update(replace or {})
    save_file(state, path)


def raises(match, fn, *args, **kw):
    with pytest.raises(UserError, match=match) as e:
        fn(*args, **kw)
    return str(e.value)


def test_missing_drafter_tensor(pair):
    t, d = pair
    edit_tensors(d / "model.safetensors", drop=["layers.1.mlp.up_proj.weight"])
    msg = raises("missing tensor layers.1.mlp.up_proj.weight", load_pair, t, d)
    assert "drafter" in msg and "[96, 64]" in msg


def test_misshaped_drafter_tensor(pair):
    t, d = pair
    edit_tensors(d / "model.safetensors", replace={"layers.0.self_attn.k_proj.weight": torch.zeros(64, 64)})
    msg = raises("model.safetensors: layers.0.self_attn.k_proj.weight has shape", load_pair, t, d)
    assert msg.endswith("has shape [64, 64], expected [32, 64] (num_key_value_heads*head_dim, hidden_size)")


def test_missing_target_tensor(pair):
    t, d = pair
    edit_tensors(t / "model.safetensors", drop=["model.layers.2.self_attn.q_norm.weight"])
    raises(r"target .*missing tensor model.layers.2.self_attn.q_norm.weight \(expected shape \[16\] \(head_dim\)\)",
           load_target, t)


def test_misshaped_fc(pair):
    """fc.weight must be [hidden, len(target_layer_ids) * hidden]."""
    t, d = pair
    edit_tensors(d / "model.safetensors", replace={"fc.weight": torch.zeros(64, 192)})
    raises(r"fc.weight has shape \[64, 192\], expected \[64, 128\]", load_pair, t, d)


def test_mask_token_outside_vocab(pair):
    t, d = pair
    edit_json(d / "config.json", **{"dflash_config.mask_token_id": 300})
    raises(r"mask_token_id 300 is outside the target's vocabulary \(vocab_size 256", load_pair, t, d)


def test_target_layer_ids_beyond_depth(pair):
    t, d = pair
    edit_json(d / "config.json", **{"dflash_config.target_layer_ids": [0, 4]})
    raises(r"target_layer_ids \[0, 4\] has 4, beyond the target's depth \(4 layers, valid ids 0..3\)", load_pair, t, d)


def test_hidden_size_mismatch(pair):
    t, d = pair
    edit_json(d / "config.json", hidden_size=32)
    raises("hidden_size 32 does not match the target's hidden_size 64", load_pair, t, d)


def test_num_target_layers_mismatch(pair):
    t, d = pair
    edit_json(d / "config.json", num_target_layers=36)
    raises("num_target_layers is 36 but the target has 4 layers", load_pair, t, d)


def test_block_size_not_trained_for(qwen3_pair, monkeypatch):
    target, drafter = load_pair(*qwen3_pair)

    def no_work(*a, **k):
        raise AssertionError("the target ran before the arguments were checked")

    monkeypatch.setattr(Target, "forward", no_work)
    raises("block size 16 is not one the drafter was trained for: its block_size is 8; use 2..8",
           generate, target, drafter, [[1, 2]], 5, block_size=16)
    raises("block size 1 is not one", generate, target, drafter, [[1, 2]], 5, block_size=1)
    raises("token id 256 is outside the target's vocabulary", generate, target, drafter, [[1, 256]], 5)
    raises("max_new_tokens has 1 entries for 2 prompts", generate, target, drafter, [[1], [2]], [5])
    raises("mode 'tree' is not one of ar, dflash, ddtree", generate, target, drafter, [[1]], 5, mode="tree")


def test_config_errors_come_before_weights(pair):
    """A pairing problem is reported even when the weights are unreadable: nothing was read."""
    t, d = pair
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    edit_json(d / "config.json", hidden_size=32)
    raises("hidden_size 32 does not match", load_pair, t, d)


@pytest.mark.parametrize(
    "who,changes,match",
    [
        ("target", {"model_type": "gemma3"}, "model_type 'gemma3' is not supported"),
        ("target", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
         "rope type 'yarn' is not supported"),
        ("target", {"use_sliding_window": True}, "sliding-window target layers are not supported"),
        ("target", {"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ("drafter", {"dflash_config.mask_token_id": None}, "missing dflash_config.mask_token_id"),
        ("drafter", {"block_size": None}, "missing required field 'block_size'"),
        ("drafter", {"attention_sink_bias": 0.5},
         "'attention_sink_bias' is set: this drafter variant is not supported"),
        ("drafter", {"output_multiplier": -0.5}, "'output_multiplier' is -0.5, expected a positive number"),
        ("drafter", {"conv_kernel_size": 2}, "missing dflash_config.conv_group_size"),
        ("drafter", {"layer_types": ["sliding_attention", "full_attention"]},
         "missing required field 'sliding_window'"),
    ],
)
def test_config_errors(pair, who, changes, match):
    t, d = pair
    directory = t if who == "target" else d
    if "dflash_config.mask_token_id" in changes:
        cfg = json.loads((d / "config.json").read_text())
        del cfg["dflash_config"]["mask_token_id"]
        (d / "config.json").write_text(json.dumps(cfg))
    else:
        edit_json(directory / "config.json", **changes)
    msg = raises(match, load_pair, t, d)
    assert msg.startswith(f"{who} {directory.name}/config.json: ")


def test_missing_shard(tmp_path):
    from reference_helpers import make_target

    t = make_target(tmp_path / "t", sharded=True)
    index = json.loads((t / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (t / victim).unlink()
    raises(f"target {victim}: file not found", load_target, t)


def test_drafter_without_target_check(pair):
    """load_drafter alone validates the checkpoint but cannot check the pairing."""
    _, d = pair
    assert load_drafter(d).block_size == 8
