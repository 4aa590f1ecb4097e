"""`trtllm-dflash generate`: the scripting contract (--json fields), streaming text,
the tokenizer requirement of --prompt, --recipe, and one-line errors with exit code 2."""

import json
import shutil

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trtllm_dflash.cli import main
from trtllm_dflash.reference import generate, load_pair


@pytest.fixture(scope="module")
def with_tokenizer(qwen3_pair, tmp_path_factory):
    """The session target plus a byte-level tokenizer with exactly 256 tokens (one per byte)."""
    target = tmp_path_factory.mktemp("tok") / "target"
    shutil.copytree(qwen3_pair[0], target)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(target)
    return target, qwen3_pair[1]


def run_cli(capsys, *argv):
    rc = main(["generate", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_contract(qwen3_pair, capsys):
    t, d = qwen3_pair
    rc, out, _ = run_cli(capsys, "--target", t, "--drafter", d, "--prompt-ids", "5,6,7", "--max-new-tokens", 20,
                         "--mode", "ddtree", "--ddtree-budget", 10, "--json")
    assert rc == 0
    res = json.loads(out)
    target, drafter = load_pair(t, d)
    (ref,) = generate(target, drafter, [[5, 6, 7]], 20, mode="ddtree", ddtree_budget=10)
    assert res["tokens"] == ref.tokens
    assert res["accepted_per_round"] == ref.stats.accepted_per_round and res["rounds"] == ref.stats.rounds
    assert res["tau"] == pytest.approx(ref.stats.tau)
    assert res["text"] is None  # no tokenizer in this target directory
    assert 1 + sum(res["accepted_per_round"]) == len(res["tokens"])  # prefill token + every round's


def test_prompt_text_json_and_stream(with_tokenizer, capsys):
    t, d = with_tokenizer
    args = ["--target", t, "--drafter", d, "--prompt", "def f(x):", "--max-new-tokens", 24,
            "--temperature", 0.8, "--top-k", 20, "--seed", 3]
    rc, out, _ = run_cli(capsys, *args, "--json")
    res = json.loads(out)
    tok = PreTrainedTokenizerFast.from_pretrained(t)
    assert res["prompt_ids"] == tok("def f(x):")["input_ids"] and len(res["tokens"]) == 24
    assert res["text"] == tok.decode(res["tokens"], skip_special_tokens=True)
    rc, out, err = run_cli(capsys, *args)  # same seed, streamed: the same text
    assert rc == 0 and out == res["text"] + "\n"
    assert "tau" in err and "24 tokens" in err


def test_prompt_needs_tokenizer(qwen3_pair, capsys):
    t, d = qwen3_pair
    rc, out, err = run_cli(capsys, "--target", t, "--drafter", d, "--prompt", "hi", "--max-new-tokens", 4)
    assert rc == 2 and err.startswith("error: --prompt needs a tokenizer") and err.count("\n") == 1


def test_block_size_error(qwen3_pair, capsys):
    t, d = qwen3_pair
    rc, _, err = run_cli(capsys, "--target", t, "--drafter", d, "--prompt-ids", "1,2", "--max-new-tokens", 4,
                         "--block-size", 9)
    assert rc == 2 and "block size 9 is not one the drafter was trained for" in err


def test_ar_needs_no_drafter(qwen3_pair, capsys):
    t, d = qwen3_pair
    rc, out, _ = run_cli(capsys, "--target", t, "--prompt-ids", "5,6,7", "--max-new-tokens", 12, "--mode", "ar",
                         "--json")
    rc2, out2, _ = run_cli(capsys, "--target", t, "--drafter", d, "--prompt-ids", "5,6,7", "--max-new-tokens", 12,
                           "--json")
    assert rc == rc2 == 0
    ar, spec = json.loads(out), json.loads(out2)
    assert ar["tokens"] == spec["tokens"] and ar["tau"] == 1.0


def tiny_recipe(path, pair, extra: str):
    t, d = pair
    path.write_text(
        "name: tiny\nhardware: {gpu: cpu}\nbackend: reference\n"
        f"target: {{source: {t}}}\ndrafter: {{source: {d}}}\n"
        "quantization: {target_weights: fp32, activations: fp32, kv_cache: fp32, drafter: fp32}\n" + extra
    )
    return path


def test_recipe(qwen3_pair, tmp_path, capsys):
    t, d = qwen3_pair
    recipe = tiny_recipe(tmp_path / "r.yaml", qwen3_pair, "speculative: {block_size: 4, ddtree_budget: 5}\n")
    rc, out, err = run_cli(capsys, "--recipe", recipe, "--prompt-ids", "5,6,7", "--max-new-tokens", 16, "--json")
    assert rc == 0, err
    target, drafter = load_pair(t, d)
    (ref,) = generate(target, drafter, [[5, 6, 7]], 16, block_size=4)
    assert json.loads(out)["tokens"] == ref.tokens
    rc, _, err = run_cli(capsys, "--recipe", recipe, "--target", t, "--prompt-ids", "1", "--max-new-tokens", 2)
    assert rc == 2 and "--recipe replaces --target/--drafter" in err


def test_max_new_tokens_beyond_the_sequence_limit_is_refused(qwen3_pair, tmp_path, capsys):
    t, d = qwen3_pair
    recipe = tiny_recipe(tmp_path / "r.yaml", qwen3_pair,
                         "build: {max_input_len: 16, max_seq_len: 40}\nspeculative: {block_size: 4}\n")
    rc, _, err = run_cli(capsys, "--recipe", recipe, "--prompt-ids", "5,6,7", "--max-new-tokens", 38)
    assert rc == 2 and err.strip() == ("error: --max-new-tokens 38 with a prompt of 3 tokens exceeds "
                                       f"build.max_seq_len of {recipe}, 40: at most 37 new tokens")
    rc, out, err = run_cli(capsys, "--recipe", recipe, "--prompt-ids", "5,6,7", "--max-new-tokens", 37, "--json")
    assert rc == 0 and len(json.loads(out)["tokens"]) <= 37, err
    rc, _, err = run_cli(capsys, "--target", t, "--drafter", d, "--prompt-ids", "5", "--max-new-tokens", 10**6)
    assert rc == 2 and "exceeds the target's max_position_embeddings" in err
    rc, _, err = run_cli(capsys, "--target", t, "--drafter", d, "--prompt-ids", "5", "--max-new-tokens", 0)
    assert rc == 2 and "--max-new-tokens 0: expected at least 1" in err
