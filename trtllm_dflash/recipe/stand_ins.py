"""Stand-ins: tiny random checkpoints in the architectures a recipe names, written under a models
root as `hf download ORG/NAME --local-dir ROOT/ORG/NAME` writes the real ones, so every stage of
a GPU recipe runs on a laptop up to the step that needs the GPU (`trtllm-dflash models --stand-ins`).

The target is the HF model class of the recipe's architecture (transformers' own config and
`save_pretrained`), the drafter a z-lab-layout DFlash drafter with the recipe's block size, paired
with it. Both are shaped to split 16 ways (attention heads, experts, vocabulary: two nodes of 8
GPUs), with the real model's context length. Each config.json carries STAND_IN_KEY naming the
id it stands in for (and a README.md says so), so nobody mistakes it for the model: the reader
takes a stand-in's facts from its own config.json in the stages and the catalog's in check, plan
and project (reader.py). Seeded: the same recipe writes the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.models import ArchFacts
from trtllm_dflash.recipe.models_root import STAND_IN_KEY, stand_in_of
from trtllm_dflash.recipe.schema import Recipe

VERSION = 1  # bumped when the stand-ins' shape changes, so an older one is rewritten
VOCAB = 256
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=16, num_key_value_heads=8,
             head_dim=8)
TARGET_LAYERS, DRAFTER_LAYERS, EXPERTS, TOP_K = 4, 2, 16, 2


@dataclass
class Written:
    role: str
    repo_id: str
    path: Path
    what: str  # "wrote", "current" (an identical stand-in was there)


def marker(repo_id: str) -> dict:
    return {"of": repo_id, "version": VERSION, "written_by": "trtllm-dflash models --stand-ins",
            "note": f"tiny random weights in the architecture of {repo_id}; not the model"}


def write_stand_ins(recipe: Recipe, root: Path) -> list[Written]:
    """A stand-in under `root` for each of the recipe's Hugging Face ids (sources shipped with the
    package or local directories need none). Refuses, writing nothing, when a folder already
    holds a checkpoint that is not a stand-in (a download)."""
    todo = [(role, getattr(recipe, role)) for role in ("target", "drafter")]
    todo = [(role, src.source) for role, src in todo if not src.is_local]
    for role, repo_id in todo:
        d = root / repo_id
        if (d / "config.json").is_file() and stand_in_of(d) is None:
            raise UserError(f"{role}.source: {d} holds a checkpoint that is not a stand-in (a download?); "
                            "stand-ins are written into an empty folder or over earlier stand-ins only")
    out = []
    for role, repo_id in todo:
        d = root / repo_id
        if _current(d, repo_id):
            out.append(Written(role, repo_id, d, "current"))
            continue
        facts = recipe.target_facts if role == "target" else recipe.drafter_facts
        _write_atomically(d, lambda tmp, f=facts, r=repo_id, role=role: _write(role, tmp, f, recipe.target_facts, r))
        out.append(Written(role, repo_id, d, "wrote"))
    return out


def _current(d: Path, repo_id: str) -> bool:
    try:
        return json.loads((d / "config.json").read_text()).get(STAND_IN_KEY) == marker(repo_id)
    except (OSError, ValueError):
        return False


def _write_atomically(d: Path, write) -> None:
    tmp = d.parent / f".{d.name}.stand-in-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)


def _write(role: str, d: Path, facts: ArchFacts, target: ArchFacts, repo_id: str) -> None:
    if role == "target":
        _target(d, facts)
    else:
        _drafter(d, facts, target)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, STAND_IN_KEY: marker(repo_id)}, indent=2) + "\n")
    (d / "README.md").write_text(
        f"# Stand-in for {repo_id}\n\nNot the model: {TARGET_LAYERS if role == 'target' else DRAFTER_LAYERS} "
        f"layers of tiny random weights in its architecture, written by `trtllm-dflash models --stand-ins` so the "
        f"pipeline runs without the download. Get the model with `hf download {repo_id} --local-dir` "
        "this folder (after deleting it).\n")


def target_config(facts: ArchFacts) -> dict:
    """The transformers config of a target stand-in: the family's model type, SHAPE, the real
    context length, the real MLP kind (dense or mixture of experts)."""
    cfg: dict = dict(SHAPE, model_type=facts.family, num_hidden_layers=TARGET_LAYERS,
                     max_position_embeddings=facts.max_position_embeddings or 8192,
                     tie_word_embeddings=facts.tie_word_embeddings, bos_token_id=None, eos_token_id=None,
                     pad_token_id=None)
    if facts.family == "qwen3_moe":
        cfg.update(num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=32, norm_topk_prob=True)
    elif facts.family == "gpt_oss":  # experts with biases; sliding-window layers alternate with full ones
        cfg.update(num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, intermediate_size=32,
                   sliding_window=facts.sliding_window or 128,
                   layer_types=["sliding_attention", "full_attention"] * (TARGET_LAYERS // 2))
    return cfg


def _target(d: Path, facts: ArchFacts) -> None:
    import torch
    import transformers

    cfg = target_config(facts)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()  # one line per stand-in, not a shard bar
    transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).save_pretrained(d)


def drafter_config(facts: ArchFacts, target: ArchFacts) -> dict:
    """The z-lab config.json of a drafter stand-in for a `target_config` target."""
    if facts.variant != "dflash":
        raise UserError(f"drafter.arch: a stand-in of a {facts.variant} drafter is not implemented (dflash only)")
    return dict(
        architectures=["DFlashDraftModel"], model_type="qwen3", num_hidden_layers=DRAFTER_LAYERS,
        **{k: v for k, v in SHAPE.items() if k != "vocab_size"}, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=target.max_position_embeddings or 8192, block_size=facts.block_size or 16,
        num_target_layers=TARGET_LAYERS,
        dflash_config={"target_layer_ids": [0, TARGET_LAYERS - 2], "mask_token_id": VOCAB - 1},
    )


def _drafter(d: Path, facts: ArchFacts, target: ArchFacts) -> None:
    import torch

    from trtllm_dflash.reference import DFlashDraft, DraftConfig, save_drafter

    cfg = DraftConfig.from_dict(drafter_config(facts, target), "drafter stand-in")
    torch.manual_seed(1)
    model = DFlashDraft(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    save_drafter(model, d, dtype=torch.float32)
    # z-lab configs are Qwen3 config dumps and carry vocab_size (the recipe's facts read it)
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, "vocab_size": VOCAB}, indent=2))
