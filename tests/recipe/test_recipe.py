"""Recipe schema and rules: every shipped recipe passes; each bad input names its field."""

import json
import re
from pathlib import Path

import pytest
import yaml

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import RecipeError, check, default_recipe_path, list_recipes, load_recipe

REPO_RECIPES = Path(__file__).resolve().parents[2] / "recipes"
LLAMA_H100 = REPO_RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"


def write_variant(tmp_path: Path, base: Path, edit) -> Path:
    raw = yaml.safe_load(base.read_text())
    edit(raw)
    out = tmp_path / "variant.yaml"
    out.write_text(yaml.safe_dump(raw))
    return out


def load_error(path: Path) -> str:
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    return str(e.value)


def test_shipped_recipes_are_the_repository_recipes():
    shipped = {p.relative_to(p.parents[1]) for p in list_recipes()}
    in_repo = {p.relative_to(REPO_RECIPES) for p in REPO_RECIPES.glob("*/*.yaml")}
    assert shipped == in_repo and len(shipped) >= 7
    assert {p.parts[0] for p in shipped} == {"hopper", "blackwell", "cpu"}


@pytest.mark.parametrize("path", list_recipes(), ids=lambda p: p.name)
def test_every_shipped_recipe_passes(path):
    recipe = load_recipe(path)
    assert not [i for i in check(recipe) if i.level == "error"]


def test_default_recipe_is_the_cpu_reference_recipe():
    r = load_recipe(None)
    assert default_recipe_path().parent.name == "cpu"
    assert r.backend.name == "reference" and r.hardware.gpu == "cpu"


def test_nvfp4_on_hopper_is_rejected(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["quantization"].update(target_weights="nvfp4"))
    msg = load_error(p)
    line = p.read_text().splitlines().index("  target_weights: nvfp4") + 1
    assert msg.startswith(f"{p}:{line}:3: quantization.target_weights: nvfp4 is not supported on h100-sxm")
    assert "Blackwell" in msg and len(msg.splitlines()) == 1


def test_tp_that_does_not_divide_heads_is_rejected(tmp_path):
    def edit(r):
        r["parallel"]["tp"] = 3
        r["hardware"]["count"] = 4

    msg = load_error(write_variant(tmp_path, LLAMA_H100, edit))
    assert "parallel.tp: 3 does not divide target num_attention_heads 32" in msg
    assert "[1, 2, 4, 8]" in msg and len(msg.splitlines()) == 1


def test_unknown_key_names_the_field_and_allowed_keys(tmp_path):
    p = tmp_path / "variant.yaml"
    p.write_text(re.sub(r"(max_num_tokens: \d+)\}", r"\1, max_batch: 8}", LLAMA_H100.read_text()))
    (line, text), = [(n, t) for n, t in enumerate(p.read_text().splitlines(), 1) if "max_batch:" in t]
    msg = load_error(p)
    assert msg == (f"{p}:{line}:{text.index('max_batch:') + 1}: build.max_batch: unknown key (allowed: max_batch_size, "
                   "max_input_len, max_seq_len, max_num_tokens, kv_cache_reuse)")


# Every recipe error starts where its field was written: the YAML line and column of the key, the
# --set that set it, or the nearest written section of a field left to its default.
POSITIONED = """name: t
hardware: {gpu: h100-sxm, count: 1}
target:
  source: meta-llama/Llama-3.1-8B-Instruct
  arch: llama-3.1-8b-instruct
drafter: {source: z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat, arch: llama-3.1-8b-instruct-dflash}
quantization: {target_weights: fp8, activations: fp8, kv_cache: bf16, drafter: bf16}
backend: {name: engine, trtllm_version: 1.2.1}
build: {max_batch_size: 64, max_input_len: 2048, max_seq_len: 4096, max_num_tokens: 8192}
speculative:
  block_size: 10
sweep: {concurrency: [1, 2, 64], input_len: 1024, output_len: 1024}
"""


@pytest.mark.parametrize("edit, overrides, starts", [
    (("  block_size: 10", "  block_size: 10\n  draft_lenn: 3"), [], ":12:3: speculative.draft_lenn: unknown key"),
    (("target:\n", "target:\n  revision: main\n"), [], ":4:3: target.revision: unknown key"),
    (("name: t\n", ""), [], ":1:1 (not set): name: required field is missing"),
    (("gpu: h100-sxm", "gpu: a100"), [], ":2:12: hardware.gpu: unknown device 'a100'"),
    (("arch: llama-3.1-8b-instruct\n", "arch: llama-9\n"), [], ":5:3: target.arch: unknown model 'llama-9'"),
    (("", ""), ["parallel.tp=3", "hardware.count=4"], " (--set parallel.tp=3): parallel.tp: 3 does not divide"),
    (("[1, 2, 64]", "[1, 2, 128]"), [], ":12:9: sweep.concurrency: level 128 > build.max_batch_size 64"),
    (("target_weights: fp8", "target_weights: nvfp4"), [], ":7:16: quantization.target_weights: nvfp4"),
    (("{name: engine, trtllm_version: 1.2.1}", "{name: engine, trtllm_version: 1.2.1}\nparallel: {}"),
     ["speculative.block_size=10"], ""),  # a recipe that passes: no error to place
    (("  block_size: 10", "  block_size: 10\n  draft_len: [{max_concurrency: 8, draft_len: 12}]"), [],
     ":12:36: speculative.draft_len.0.draft_len: 12 > block_size-1"),
])
def test_every_recipe_error_names_its_line_and_column(tmp_path, edit, overrides, starts):
    p = tmp_path / "r.yaml"
    p.write_text(POSITIONED.replace(*edit, 1))
    if not starts:
        assert load_recipe(p, overrides).name == "t"
        return
    msg = load_error_with(p, overrides)
    assert msg.startswith(f"{p}{starts}"), msg


def test_a_default_that_breaks_a_rule_names_its_section(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(POSITIONED.replace("  block_size: 10", "  block_size: 10\n  ddtree_budget: 3"))
    from trtllm_dflash.recipe.positions import Positions

    where = Positions(str(p), p.read_text())
    assert where.at("build.kv_cache_reuse") == f"{p}:9:1 (in build, not set): build.kv_cache_reuse"
    assert where.at("serve.http_port") == f"{p}:1:1 (not set): serve.http_port"
    assert where.at("speculative.ddtree_budget") == f"{p}:12:3: speculative.ddtree_budget"


def load_error_with(path: Path, overrides: list[str]) -> str:
    with pytest.raises(UserError) as e:  # a RecipeError, or the catalog's UserError for an unknown model
        load_recipe(path, overrides)
    return str(e.value)


def test_bad_enum_value_lists_what_is_allowed(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r.update(backend="tensorrt"))
    msg = load_error(p)
    assert "backend.name" in msg and "'reference', 'engine' or 'pytorch'" in msg


def test_tp_larger_than_device_count(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["parallel"].update(tp=2))
    assert "parallel.tp: tp*pp = 2 > hardware.count 1" in load_error(p)


def test_tp_two_is_valid_on_cpu():
    r = load_recipe(None, overrides=["parallel.tp=2"])
    assert r.parallel.tp == 2


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("hidden_size", 2048, "drafter: hidden_size 2048 != target hidden_size 4096"),
        ("vocab_size", 1000, "drafter: vocab_size 1000 != target vocab_size 128256"),
        ("target_layer_ids", [1, 8, 40], "target_layer_ids [40] outside the target's layers 0..31"),
        ("mask_token_id", 200000, "mask_token_id 200000 outside the target vocabulary (size 128256)"),
    ],
)
def test_drafter_must_agree_with_target(tmp_path, field, value, expected):
    from trtllm_dflash.recipe.models import catalog_facts

    facts = catalog_facts("llama-3.1-8b-instruct-dflash", "test").model_dump()
    facts[field] = value
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["drafter"].update(arch=facts))
    assert expected in load_error(p)


def test_block_size_beyond_training(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["speculative"].update(block_size=16, draft_len=[]))
    assert "speculative.block_size: 16 > 10, the block size the drafter was trained with" in load_error(p)


def test_block_size_out_of_range(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["speculative"].update(block_size=1))
    assert "speculative.block_size: Input should be greater than or equal to 2" in load_error(p)


def test_gpt_oss_is_not_on_the_engine_path(tmp_path):
    base = REPO_RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"
    p = write_variant(tmp_path, base, lambda r: r.update(backend={"name": "engine", "trtllm_version": "1.2.1"}))
    assert "backend: engine does not support gpt_oss targets; use one of: pytorch" in load_error(p)


@pytest.mark.parametrize(
    "backend,version,expected",
    [
        ("engine", "1.3.0", "the engine backend needs TensorRT-LLM 1.2.x"),
        ("pytorch", "1.2.1", "the pytorch backend needs TensorRT-LLM >= 1.3"),
        ("engine", "banana", "is not a version like 1.2.1"),
    ],
)
def test_backend_versions(tmp_path, backend, version, expected):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r.update(backend={"name": backend, "trtllm_version": version}))
    assert "backend.trtllm_version: " in load_error(p) and expected in load_error(p)


def test_pytorch_backend_keeps_the_drafter_bf16(tmp_path):
    base = REPO_RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"
    p = write_variant(tmp_path, base, lambda r: r["quantization"].update(drafter="fp8"))
    assert "quantization.drafter: fp8: TensorRT-LLM's native DFlash loads only BF16 drafters" in load_error(p)


def test_max_num_tokens_must_hold_a_batch_of_blocks(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["build"].update(max_num_tokens=320))
    assert "build.max_num_tokens: 320 < max_batch_size x block_size = 640" in load_error(p)


def test_memory_that_does_not_fit_names_the_largest_batch(tmp_path):
    def edit(r):
        r["build"].update(max_batch_size=512, max_num_tokens=8192)
        r["sweep"]["concurrency"] = [1, 2]

    msg = load_error(write_variant(tmp_path, LLAMA_H100, edit))
    assert "build.max_batch_size: 512 sequences of 4096 tokens need" in msg and "largest that fits:" in msg


def test_unknown_hardware(tmp_path):
    p = write_variant(tmp_path, LLAMA_H100, lambda r: r["hardware"].update(gpu="a100"))
    assert "hardware.gpu: unknown device 'a100'; allowed: h100-sxm, h200, b200, b300, cpu" in load_error(p)


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert "not valid YAML" in load_error(bad)
    assert "recipe file not found" in load_error(tmp_path / "nope.yaml")


def test_override_syntax_error():
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        load_recipe(None, overrides=["parallel.tp"])


def test_local_source_without_arch_reads_config_json(tmp_path):
    from transformers import Qwen3Config

    Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
    ).save_pretrained(tmp_path / "target")
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "config.json").write_text(json.dumps(dict(
        architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=64, intermediate_size=128,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
        block_size=8, num_target_layers=4, dflash_config={"target_layer_ids": [0, 2], "mask_token_id": 3},
    )))
    recipe_path = tmp_path / "r.yaml"
    recipe_path.write_text(yaml.safe_dump(dict(
        name="local", hardware={"gpu": "cpu"}, backend="reference",
        target={"source": "target"}, drafter={"source": "./drafter"},
        quantization={"target_weights": "fp32", "activations": "fp32", "kv_cache": "fp32", "drafter": "fp32"},
        build={"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256},
        speculative={"block_size": 8}, sweep={"concurrency": [1, 2], "input_len": 16, "output_len": 16},
    )))
    r = load_recipe(recipe_path)
    assert r.target.path == (tmp_path / "target").resolve()
    assert r.target_facts.family == "qwen3" and r.target_facts.num_layers == 4 and r.target_facts.tie_word_embeddings
    assert r.drafter_facts.is_drafter and r.drafter_facts.target_layer_ids == [0, 2]
    assert r.drafter_facts.mask_token_id == 3 and r.drafter_facts.block_size == 8


def test_recipe_hash_changes_with_content():
    a = load_recipe(None)
    b = load_recipe(None, overrides=["build.max_batch_size=8"])
    assert a.sha256() == load_recipe(None).sha256() != b.sha256()


def test_arch_must_agree_with_the_local_checkpoint(tmp_path):
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16).save_pretrained(tmp_path / "target")
    raw = yaml.safe_load((REPO_RECIPES / "cpu" / "tiny-pystd.yaml").read_text())
    raw["target"] = {"source": "target", "arch": {
        "family": "qwen3", "num_layers": 6, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 512}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    msg = load_error(path)
    assert f"target.arch: num_layers is 6 but {tmp_path / 'target' / 'config.json'} says 4" in msg


def test_binary_recipe_is_one_line_not_a_traceback(tmp_path, capsys):
    from trtllm_dflash.cli import main

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x80\x00\xff\xfe binary")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}: not a text file (byte 0 is not UTF-8); expected a recipe YAML file\n"


def test_the_reader_names_the_models_root_it_was_given(tmp_path, monkeypatch):
    """A source without arch is read from its download: a models root that does not exist is the
    line --models gets; one that lacks the id names the hf download into it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    p = tmp_path / "r.yaml"
    p.write_text(POSITIONED.replace("  arch: llama-3.1-8b-instruct\n", ""))
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", str(tmp_path / "nope"))
    assert load_error_with(p, []).startswith(f"$TRTLLM_DFLASH_MODELS {tmp_path / 'nope'}: no such directory (the "
                                             "models root:")
    monkeypatch.setenv("TRTLLM_DFLASH_MODELS", str(tmp_path))
    msg = load_error_with(p, [])
    assert msg.startswith(f"{p}:3:1 (in target, not set): target.arch: required when target.source")
    assert msg.endswith(f"download it: `hf download meta-llama/Llama-3.1-8B-Instruct --local-dir {tmp_path.resolve()}"
                        "/meta-llama/Llama-3.1-8B-Instruct`, or set target.source to the directory")
