"""`trtllm-dflash bench decode RECIPE --json` on tiny random models: the JSON contract."""

import json

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, Qwen3Config

from trtllm_dflash.cli import main
from trtllm_dflash.reference import DFlashDraft, DraftConfig, load_target, save_drafter


def _hf(directory, layers, seed):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_hidden_layers=layers, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # peaked logits: clear greedy margins (no fp32 near-ties)
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.1)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = _hf(root / "target", 4, 0)
    _hf(root / "ar-draft", 1, 1)  # the assisted-generation baseline's draft, found next to the drafter
    tcfg = load_target(target).cfg
    torch.manual_seed(2)
    d = DFlashDraft(DraftConfig(hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4, num_kv_heads=2,
                                head_dim=16, rms_norm_eps=1e-6, rope=tcfg.rope, max_position_embeddings=256,
                                block_size=4, target_layer_ids=(1, 2), mask_token_id=1, num_target_layers=4,
                                vocab_size=128))
    save_drafter(d, root / "drafter")
    recipe = {
        "name": "tiny-bench", "hardware": {"gpu": "cpu", "count": 1},
        "target": {"source": str(target)}, "drafter": {"source": str(root / "drafter")},
        "quantization": {"target_weights": "fp32", "activations": "fp32", "kv_cache": "fp32", "drafter": "fp32"},
        "parallel": {"tp": 1}, "backend": "reference",
        "build": {"max_batch_size": 1, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 128},
        "speculative": {"block_size": 4, "ddtree_budget": 4},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_bench_decode_json_fields(tiny_recipe, capsys):
    rc = main(["bench", "decode", str(tiny_recipe), "--json", "--prompts", "2", "--prompt-len", "6",
               "--max-new-tokens", "10", "--repeats", "1", "--threads", "1"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("tau", "ar_tok_s", "dflash_tok_s", "speedup", "ddtree_tok_s", "ddtree_speedup", "ddtree_tau"):
        assert isinstance(out[key], float) and out[key] > 0, key
    assert 1.0 <= out["tau"] <= 4.0 and 1.0 <= out["ddtree_tau"] <= 5.0  # block 4; ddtree depth <= 3 + bonus
    assert out["speedup"] == pytest.approx(out["dflash_tok_s"] / out["ar_tok_s"])
    assert out["identical_to_ar"] == {"ar": "2/2", "dflash": "2/2", "ddtree": "2/2"}
    assert out["settings"]["block_size"] == 4 and out["settings"]["ddtree_budget"] == 4
    assert out["prompts"]["from"].startswith("random")  # no tokenizer in the tiny target
    b = out["baselines"]
    assert b["hf_ar_identical_to_ar"] == "2/2"  # HF and the reference agree on greedy output
    for m in ("hf_assisted", "hf_prompt_lookup"):
        assert b[f"{m}_tok_s"] > 0 and b[f"{m}_speedup"] == pytest.approx(b[f"{m}_tok_s"] / b["hf_ar_tok_s"])
        assert b[f"{m}_identical_to_hf_ar"] == "2/2"
    assert "1 layers" in b["notes"]["hf_assisted"]


def test_bench_decode_refuses_a_non_local_recipe(tmp_path, capsys):
    from trtllm_dflash.recipe import list_recipes

    hopper = next(p for p in list_recipes() if p.parent.name == "hopper")  # HF ids, not local checkpoints
    assert main(["bench", "decode", str(hopper), "--json"]) == 2
    assert "not a local checkpoint directory" in capsys.readouterr().err


def test_bench_decode_reports_a_dflash2_drafter(tiny_recipe, capsys):
    """--dflash2-drafter: a fourth mode beside DFlash and DDTree, greedy-identical to AR."""
    tcfg = load_target(tiny_recipe.parent / "target").cfg
    torch.manual_seed(3)
    d = DFlashDraft(DraftConfig(hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4, num_kv_heads=2,
                                head_dim=16, rms_norm_eps=1e-6, rope=tcfg.rope, max_position_embeddings=256,
                                block_size=4, target_layer_ids=(1, 2), mask_token_id=1, num_target_layers=4,
                                vocab_size=128, conv_kernel_size=2, conv_group_size=16, selector_rank=8,
                                selector_top_k=8))
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.normal_(0, 0.1) if not name.endswith("norm.weight") else p.fill_(1.0)
    save_drafter(d, tiny_recipe.parent / "dflash2")
    rc = main(["bench", "decode", str(tiny_recipe), "--json", "--prompts", "2", "--prompt-len", "6",
               "--max-new-tokens", "10", "--repeats", "1", "--threads", "1", "--no-baselines",
               "--dflash2-drafter", str(tiny_recipe.parent / "dflash2")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 1.0 <= out["dflash2_tau"] <= 4.0 and out["dflash2_block_size"] == 4
    assert out["dflash2_speedup"] == pytest.approx(out["dflash2_tok_s"] / out["ar_tok_s"])
    assert out["identical_to_ar"] == {"ar": "2/2", "dflash": "2/2", "ddtree": "2/2", "dflash2": "2/2"}
    assert out["passes"]["dflash2_draft_pass_ms"] > 0
    assert main(["bench", "decode", str(tiny_recipe), "--prompts", "1", "--repeats", "1", "--no-baselines",
                 "--dflash2-drafter", str(tiny_recipe.parent / "drafter")]) != 0  # a DFlash drafter is refused
