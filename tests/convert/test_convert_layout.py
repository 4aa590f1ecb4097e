"""convert: TensorRT-LLM layout, TP shards, the drafter layout and the HF layout.

Oracles: the source tensors themselves (every shard reassembles to them), and ModelOpt's own
`export_tensorrt_llm_checkpoint` of the same model (tensor names, shapes, values, config).
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from checkpoints import make_drafter, make_target, modelopt_trtllm_export_archs, read_config, write_recipe
from trtllm_dflash.artifacts import Manifest, check_files
from trtllm_dflash.convert.convert import convert
from trtllm_dflash.recipe import load_recipe


def _convert(tmp_path, target, drafter, tp, fmt="fp32", **kw):
    recipe = load_recipe(write_recipe(tmp_path / f"r{tp}{fmt}.yaml", target, drafter, tp=tp, fmt=fmt))
    return convert(recipe, tmp_path / f"out-{tp}-{fmt}", progress=False, **kw)


def _source(directory):
    return load_file(directory / "model.safetensors")


def _heads(t, n_heads, d=16):
    return t.reshape(n_heads, d, *t.shape[1:])


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_target_shards_reassemble_to_the_hf_weights(tmp_path, tiny_pair, tp):
    target, drafter = tiny_pair
    out = _convert(tmp_path, target, drafter, tp)
    check_files(out, Manifest.read(out))
    src = _source(target)
    shards = [load_file(out / "target" / f"rank{r}.safetensors") for r in range(tp)]
    cfg = read_config(out / "target")
    assert cfg["architecture"] == "Qwen3ForCausalLM" and cfg["mapping"]["tp_size"] == tp == cfg["mapping"]["world_size"]
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None} and cfg["dtype"] == "float32"
    kv_per_rank = max(1, 2 // tp)
    for i in range(4):
        hf, trt = f"model.layers.{i}.", f"transformer.layers.{i}."
        q, k, v = (src[hf + f"self_attn.{x}_proj.weight"] for x in "qkv")
        qs, ks, vs = [], [], []
        for s in shards:
            qkv = s[trt + "attention.qkv.weight"]
            nq = 4 // tp * 16
            qs.append(qkv[:nq])
            ks.append(qkv[nq : nq + kv_per_rank * 16])
            vs.append(qkv[nq + kv_per_rank * 16 :])
        assert torch.equal(torch.cat(qs), q)
        if tp <= 2:  # KV heads split
            assert torch.equal(torch.cat(ks), k) and torch.equal(torch.cat(vs), v)
        else:  # tp 4 > 2 KV heads: ranks 2r and 2r+1 hold KV head r
            for r in range(tp):
                assert torch.equal(ks[r], _heads(k, 2)[r // 2]) and torch.equal(vs[r], _heads(v, 2)[r // 2])
        assert torch.equal(torch.cat([s[trt + "attention.dense.weight"] for s in shards], 1),
                           src[hf + "self_attn.o_proj.weight"])
        assert torch.equal(torch.cat([s[trt + "mlp.fc.weight"] for s in shards]), src[hf + "mlp.gate_proj.weight"])
        assert torch.equal(torch.cat([s[trt + "mlp.gate.weight"] for s in shards]), src[hf + "mlp.up_proj.weight"])
        assert torch.equal(torch.cat([s[trt + "mlp.proj.weight"] for s in shards], 1), src[hf + "mlp.down_proj.weight"])
        for s in shards:
            assert torch.equal(s[trt + "attention.q_layernorm.weight"], src[hf + "self_attn.q_norm.weight"])
            assert torch.equal(s[trt + "attention.k_layernorm.weight"], src[hf + "self_attn.k_norm.weight"])
            assert torch.equal(s[trt + "post_layernorm.weight"], src[hf + "post_attention_layernorm.weight"])
    assert torch.equal(torch.cat([s["transformer.vocab_embedding.weight"] for s in shards]),
                       src["model.embed_tokens.weight"])
    assert torch.equal(torch.cat([s["lm_head.weight"] for s in shards]), src["lm_head.weight"])


def test_drafter_layout_splits_the_kv_injection_projection(tmp_path, tiny_pair):
    target, drafter = tiny_pair
    out = _convert(tmp_path, target, drafter, 2)
    src, tsrc = _source(drafter), _source(target)
    shards = [load_file(out / "drafter" / f"rank{r}.safetensors") for r in range(2)]
    cfg = read_config(out / "drafter")
    assert cfg["architecture"] == "DFlashDrafter"
    assert cfg["dflash"]["target_layer_ids"] == [0, 2] and cfg["dflash"]["mask_token_id"] == 255
    assert cfg["dflash"]["block_size"] == 8 and cfg["mapping"]["tp_size"] == 2
    for i in range(2):
        d, t = f"layers.{i}.self_attn.", f"transformer.layers.{i}.attention."
        # rank r: [k heads of r; v heads of r] (2 KV heads over 2 ranks: one each)
        for r, s in enumerate(shards):
            kv = s[t + "kv.weight"]
            assert torch.equal(kv[:16], _heads(src[d + "k_proj.weight"], 2)[r])
            assert torch.equal(kv[16:], _heads(src[d + "v_proj.weight"], 2)[r])
        assert torch.equal(torch.cat([s[t + "q.weight"] for s in shards]), src[d + "q_proj.weight"])
        assert torch.equal(torch.cat([s[t + "dense.weight"] for s in shards], 1), src[d + "o_proj.weight"])
    assert torch.equal(torch.cat([s["dflash.fc.weight"] for s in shards]), src["fc.weight"])
    for s in shards:
        assert torch.equal(s["dflash.hidden_norm.weight"], src["hidden_norm.weight"])
        assert torch.equal(s["transformer.ln_f.weight"], src["norm.weight"])
    # the target's embedding and LM head travel with the drafter engine
    assert torch.equal(torch.cat([s["transformer.vocab_embedding.weight"] for s in shards]),
                       tsrc["model.embed_tokens.weight"])
    assert torch.equal(torch.cat([s["lm_head.weight"] for s in shards]), tsrc["lm_head.weight"])


def test_tied_embeddings_write_an_explicit_lm_head(tmp_path):
    target = make_target(tmp_path / "t", "llama", tie_word_embeddings=True)
    drafter = make_drafter(tmp_path / "d")
    out = _convert(tmp_path, target, drafter, 2)
    src = _source(target)
    assert "lm_head.weight" not in src
    shards = [load_file(out / "target" / f"rank{r}.safetensors") for r in range(2)]
    assert torch.equal(torch.cat([s["lm_head.weight"] for s in shards]), src["model.embed_tokens.weight"])
    assert "attention.q_layernorm.weight" not in " ".join(shards[0])  # Llama has no q/k norms
    assert read_config(out / "target")["architecture"] == "LlamaForCausalLM"


def test_qwen3_moe_experts_and_router(tmp_path):
    target = make_target(tmp_path / "t", "qwen3_moe")
    drafter = make_drafter(tmp_path / "d")
    out = _convert(tmp_path, target, drafter, 2)
    src = _source(target)
    shards = [load_file(out / "target" / f"rank{r}.safetensors") for r in range(2)]
    cfg = read_config(out / "target")
    assert cfg["architecture"] == "Qwen3MoeForCausalLM"
    assert cfg["moe"] == {"num_experts": 4, "top_k": 2, "normalization_mode": 1} and cfg["moe_intermediate_size"] == 32
    assert cfg["mapping"]["moe_tp_size"] == 2 and cfg["mapping"]["moe_ep_size"] == 1
    for i in range(4):
        hf, trt = f"model.layers.{i}.mlp.", f"transformer.layers.{i}.mlp."
        for s in shards:
            assert s[trt + "router.weight"].dtype == torch.float32
            assert torch.equal(s[trt + "router.weight"], src[hf + "gate.weight"])
        for e in range(4):
            up, gate, down = (src[hf + f"experts.{e}.{x}_proj.weight"] for x in ("up", "gate", "down"))
            fc = [s[trt + "fc.weight"][e] for s in shards]  # [2 * 16, 64] per rank: [up_r; gate_r]
            assert torch.equal(torch.cat([f[:16] for f in fc]), up)
            assert torch.equal(torch.cat([f[16:] for f in fc]), gate)
            assert torch.equal(torch.cat([s[trt + "proj.weight"][e] for s in shards], 1), down)


def test_hf_layout_for_the_pytorch_backend(tmp_path, tiny_pair):
    import transformers

    from trtllm_dflash.reference import load_drafter

    target, drafter = tiny_pair
    recipe = load_recipe(
        write_recipe(tmp_path / "r.yaml", target, drafter, tp=2, fmt="bf16", gpu="h100-sxm", backend="pytorch")
    )
    out = convert(recipe, tmp_path / "hf", progress=False)
    assert json.loads((out / "manifest.json").read_text())["extra"]["layout"] == "hf"
    assert not list(out.glob("target/rank*"))
    # the saved dtype (4.x loads fp32 by default)
    ours = transformers.AutoModelForCausalLM.from_pretrained(out / "target", dtype="auto")
    ref = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(ours(ids).logits, ref(ids).logits)  # the same bf16 weights, bit for bit
    d = load_drafter(out / "drafter", dtype=torch.bfloat16)
    assert torch.equal(d.fc.weight, _source(drafter)["fc.weight"].bfloat16())


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("arch,decoder", [("qwen3", "qwen"), ("llama", "llama")])
def test_target_equals_modelopt_trtllm_export(tmp_path, arch, decoder):
    pytest.importorskip("modelopt.torch.export",
                        reason="nvidia-modelopt not installed (pip install 'trtllm_dflash[quant]')")
    import transformers
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    if arch not in modelopt_trtllm_export_archs():
        pytest.skip(f"this ModelOpt cannot export a {arch} TensorRT-LLM checkpoint (needs >= 0.44); llama covers it")
    target = make_target(tmp_path / "t", arch, dtype=torch.bfloat16)
    drafter = make_drafter(tmp_path / "d", dtype=torch.bfloat16)
    out = _convert(tmp_path, target, drafter, 2, fmt="bf16")
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    export_tensorrt_llm_checkpoint(model, decoder, torch.bfloat16, tmp_path / "modelopt", inference_tensor_parallel=2)
    theirs_cfg, ours_cfg = read_config(tmp_path / "modelopt"), read_config(out / "target")
    for key in ("architecture", "dtype", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "hidden_size", "head_size", "intermediate_size", "vocab_size", "norm_epsilon", "hidden_act",
                "position_embedding_type", "use_parallel_embedding", "embedding_sharding_dim"):
        assert ours_cfg[key] == theirs_cfg[key], key
    for key in ("world_size", "tp_size", "pp_size"):
        assert ours_cfg["mapping"][key] == theirs_cfg["mapping"][key]
    for r in range(2):
        ours = load_file(out / "target" / f"rank{r}.safetensors")
        theirs = load_file(tmp_path / "modelopt" / f"rank{r}.safetensors")
        assert set(ours) == set(theirs)
        for name, t in theirs.items():
            assert ours[name].dtype == t.dtype and torch.equal(ours[name], t), name


def test_the_hf_layout_passes_a_gpt_oss_checkpoint_through(tmp_path):
    """No weight map for the pytorch backend: a sharded gpt_oss checkpoint (index + files) is
    linked byte for byte, its config.json in the recipe dtype, checksums in the manifest."""
    import transformers

    from trtllm_dflash.artifacts import sha256_file

    src = tmp_path / "t"
    model = transformers.AutoModelForCausalLM.from_pretrained(make_target(tmp_path / "t0", "gpt_oss"))
    model.save_pretrained(src, max_shard_size="100KB")
    weights = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(weights) > 1 and (src / "model.safetensors.index.json").is_file()
    drafter = make_drafter(tmp_path / "d")
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", src, drafter, tp=2, fmt="bf16", gpu="b200",
                                      backend="pytorch"))
    out = convert(recipe, tmp_path / "out", progress=False)
    m = Manifest.read(out)
    check_files(out, m)
    assert m.extra["layout"] == "hf" and m.extra["weights"] == "linked unchanged"
    assert m.extra["source_quantization"] is None
    for name in weights + ["model.safetensors.index.json"]:
        assert sha256_file(out / "target" / name) == sha256_file(src / name), name
    assert sha256_file(out / "drafter/model.safetensors") == sha256_file(drafter / "model.safetensors")
    cfg, raw = read_config(out / "target"), read_config(src)
    assert cfg.pop("dtype") == "bfloat16" and {k: v for k, v in raw.items() if k != "dtype"} == cfg
    ours = transformers.AutoModelForCausalLM.from_pretrained(out / "target", dtype="auto")
    ref = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    assert ours.dtype == torch.bfloat16 and torch.equal(ours(ids).logits, ref(ids).logits)
