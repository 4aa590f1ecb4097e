"""DFlash2 drafters (z-lab's DFlash2DraftModel) in the reference backend.

The fixture (tests/fixtures/dflash2, written by make_fixture.py with z-lab's dflash==0.1.0 in a
separate virtualenv) holds a tiny random target, a DFlash2 drafter in the published on-disk
layout (bf16, bare codebook tensors, a sliding and a full layer, is_causal false, logit
multiplier, soft-cap and embedding scale set) and z-lab's own outputs on them. Our drafter,
loaded unchanged, must reproduce them in fp32: draft logits within 1e-5, the same greedy
paths and candidates, the same selector distributions along z-lab's sampled paths, and in
the decode loop the same tokens, per-round logits and proposed paths.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trtllm_dflash.reference import DraftConfig, SamplingParams, generate, load_drafter, load_pair, load_target

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dflash2"
TOL = dict(rtol=0, atol=1e-5)  # fp32 on both sides, from the same bf16 weights (measured worst: 9.5e-7)


@pytest.fixture(scope="module")
def zlab():
    return load_file(FIXTURE / "zlab.safetensors"), json.loads((FIXTURE / "zlab.json").read_text())


@pytest.fixture(scope="module")
def pair():
    return load_pair(FIXTURE / "target", FIXTURE / "drafter")


def test_loads_zlab_layout_unchanged(pair):
    _, drafter = pair
    cfg = drafter.cfg
    assert cfg.dflash2 and (cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_rank,
                            cfg.selector_top_k) == (2, 8, 8, 6)
    assert (cfg.input_embedding_scale, cfg.output_multiplier, cfg.final_logit_softcapping) == (1.25, 0.7, 2.0)
    assert cfg.causal == (False, False) and cfg.layer_types == ("sliding_attention", "full_attention")
    with safe_open(FIXTURE / "drafter" / "model.safetensors", "pt") as f:
        names = set(f.keys())
        assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                "candidate_selector.hidden_projection.weight", "layers.1.mlp_conv.base_kernel",
                "layers.0.attention_conv.kernel_projection.weight"} <= names
        assert names == set(drafter.state_dict())
        for name, value in drafter.state_dict().items():
            raw = f.get_tensor(name)
            assert raw.dtype == torch.bfloat16 and torch.equal(value, raw.float()), name
    assert DraftConfig.from_dict(cfg.to_dict()) == cfg


def test_drafter_matches_zlab(pair, zlab):
    """Three drafter calls over a growing context: logits, greedy path and candidates, and the
    selector's q along z-lab's sampled path."""
    target, drafter = pair
    ref, meta = zlab
    feats = ref["draft.features"]
    cache = drafter.new_cache(1, 64)
    s = SamplingParams(temperature=meta["sampling_temperature"])
    worst = 0.0
    with torch.no_grad():
        for r, rnd in enumerate(meta["draft"]["rounds"]):
            (a, b), anchor = rnd["context"], torch.tensor([rnd["anchor"]])
            block = torch.tensor([[rnd["anchor"]] + [drafter.mask_token_id] * (drafter.block_size - 1)])
            hidden = drafter(target.embed_tokens(block), torch.tensor([b]), feats[:, a:b], torch.arange(a, b)[None],
                             cache)[:, 1:]
            logits = drafter.logits(hidden, target.lm_head)
            torch.testing.assert_close(logits[0], ref[f"draft.{r}.logits"], **TOL)
            worst = max(worst, float((logits[0] - ref[f"draft.{r}.logits"]).abs().max()))
            sel = drafter.candidate_selector.select(hidden, logits, anchor)
            assert sel.path[0].tolist() == ref[f"draft.{r}.greedy_path"].tolist()
            greedy = ref[f"draft.{r}.greedy_candidates"]
            assert sel.candidates[0].sort(-1).values.tolist() == greedy.sort(-1).values.tolist()
            forced = drafter.candidate_selector.select(hidden, logits, anchor, s,
                                                       path=ref[f"draft.{r}.sampled_path"][None])
            theirs = dict_q(ref[f"draft.{r}.sampled_candidates"], ref[f"draft.{r}.sampled_q"])
            ours = dict_q(forced.candidates[0], forced.q[0])
            assert ours.keys() == theirs.keys()
            torch.testing.assert_close(torch.tensor(list(ours.values())), torch.tensor([theirs[k] for k in ours]),
                                       **TOL)
    print(f"max |logit diff| vs z-lab: {worst:.2e}")


def dict_q(cand, q):
    """{(slot, token): q} for candidates [D, k] and their probabilities [D, k]."""
    return {(j, int(t)): float(p) for j in range(cand.shape[0]) for t, p in zip(cand[j], q[j])}


def test_decode_matches_zlab(pair, zlab, monkeypatch):
    """The greedy decode loop: same tokens as z-lab's dflash_generate, and in every round where
    both drafted a full block, the same draft logits and the same proposed path."""
    target, drafter = pair
    ref, meta = zlab
    seen = {"logits": [], "path": []}
    real_logits, real_select = drafter.logits, drafter.candidate_selector.select

    def logits(hidden, head):
        out = real_logits(hidden, head)
        seen["logits"].append(out[0])
        return out

    def select(*a, **k):
        sel = real_select(*a, **k)
        seen["path"].append(sel.path[0])
        return sel

    monkeypatch.setattr(drafter, "logits", logits)
    monkeypatch.setattr(drafter.candidate_selector, "select", select)
    full_rounds = 0
    for i, p in enumerate(meta["decode"]["prompts"]):
        seen["logits"].clear(), seen["path"].clear()
        (got,) = generate(target, drafter, [p["prompt"]], p["max_new_tokens"], stop_token_ids=[])
        assert got.tokens == p["tokens"]
        their_logits = ref[f"decode.{i}.logits"].split(p["slots_per_round"])
        their_paths = ref[f"decode.{i}.paths"].split(p["slots_per_round"])
        for mine_l, mine_p, their_l, path in zip(seen["logits"], seen["path"], their_logits, their_paths):
            if len(mine_p) != len(path):  # z-lab's last blocks cover one slot more than the budget
                break
            torch.testing.assert_close(mine_l, their_l, **TOL)
            assert mine_p.tolist() == path.tolist()
            full_rounds += 1
    assert full_rounds >= 30


def test_dflash2_config_errors(tmp_path):
    base = json.loads((FIXTURE / "drafter" / "config.json").read_text())
    load_target(FIXTURE / "target")

    def err(edit, match):
        raw = json.loads(json.dumps(base))
        edit(raw)
        with pytest.raises(Exception) as e:
            DraftConfig.from_dict(raw, "drafter d/config.json")
        assert match in str(e.value) and str(e.value).startswith("drafter d/config.json: "), str(e.value)

    err(lambda r: r["dflash_config"].pop("selector_top_k"), "missing dflash_config.selector_top_k")
    err(lambda r: r["dflash_config"].update(conv_group_size=5), "conv_group_size 5 does not divide hidden_size 32")
    err(lambda r: r["dflash_config"].update(selector_top_k=97), "selector_top_k 97 exceeds vocab_size 96")
    err(lambda r: r.pop("vocab_size"), "missing required field 'vocab_size'")
    err(lambda r: r.update(architectures=["DFlashDraftModel"]), "architectures is ['DFlashDraftModel'] but")
    err(lambda r: r["dflash_config"].update(final_logit_softcapping=-1), "final_logit_softcapping is -1")
    err(lambda r: r["dflash_config"].update(conv_kernel_size=0), "'conv_kernel_size' is 0")

    def arch_only(r):
        for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            r["dflash_config"].pop(k)

    err(arch_only, "architectures names DFlash2DraftModel but dflash_config.conv_kernel_size is missing")
    # keys at the top level are read too (z-lab looks in dflash_config first, then the top level)
    raw = json.loads(json.dumps(base))
    raw["selector_rank"] = raw["dflash_config"].pop("selector_rank")
    assert DraftConfig.from_dict(raw).selector_rank == 8


def test_wrong_tensor_is_named(tmp_path):
    import shutil

    from safetensors.torch import save_file

    d = tmp_path / "d"
    shutil.copytree(FIXTURE / "drafter", d)
    state = load_file(d / "model.safetensors")
    state["layers.0.mlp_conv.base_kernel"] = state["layers.0.mlp_conv.base_kernel"][:, :1].contiguous()
    save_file(state, d / "model.safetensors")
    with pytest.raises(Exception, match=r"layers.0.mlp_conv.base_kernel has shape \[2, 1, 32\], expected \[2, 2, 32\]"):
        load_drafter(d)


def test_vocab_must_match_the_target(tmp_path):
    import shutil

    d = tmp_path / "d"
    shutil.copytree(FIXTURE / "drafter", d)
    raw = json.loads((d / "config.json").read_text())
    raw["vocab_size"] = 128
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match="vocab_size 128 differs from the target's 96"):
        load_pair(FIXTURE / "target", d)
