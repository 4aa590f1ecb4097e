"""A fresh DFlash drafter for a target: its DraftConfig from a DrafterShape (the target's widths,
heads, norms and RoPE; the shape's layers, block size and fused target layers), checked, and its
first weights (init "random", or "target": the target's last layers). train/drafter.py trains it."""

from __future__ import annotations

from dataclasses import fields

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference.config import (
    DFLASH2_KEYS,
    DecoderConfig,
    DraftConfig,
    TargetConfig,
    default_target_layer_ids,
)
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.target import Target
from trtllm_dflash.train.drafter_config import INITS, VARIANTS, DrafterShape


def default_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """Three features spread over the target's depth (z-lab's rule for n = 3), or fewer
    for very shallow targets."""
    if num_target_layers >= 5:
        return tuple(default_target_layer_ids(num_target_layers, 3))
    return tuple(range(num_target_layers - 1)) or (0,)


def draft_config(tcfg: TargetConfig, shape: DrafterShape, mask_token_id: int) -> DraftConfig:
    ids = shape.target_layer_ids or default_layer_ids(tcfg.num_layers)
    bad = [i for i in ids if not 0 <= i < tcfg.num_layers]
    if bad:
        raise UserError(f"target_layer_ids {list(ids)}: {bad[0]} is outside the target's layers "
                        f"0..{tcfg.num_layers - 1}")
    if len(set(ids)) != len(ids):
        raise UserError(f"target_layer_ids {list(ids)} has repeated layers")
    if shape.num_layers < 1:
        raise UserError(f"drafter layers is {shape.num_layers}, expected >= 1")
    if shape.block_size < 2:
        raise UserError(f"block size is {shape.block_size}, expected >= 2 (anchor + at least one mask slot)")
    if not 0 <= mask_token_id < tcfg.vocab_size:
        raise UserError(f"mask_token_id {mask_token_id} is outside the target's vocabulary (0..{tcfg.vocab_size - 1})")
    if shape.init not in INITS:
        raise UserError(f"init {shape.init!r} is not one of {', '.join(INITS)}")
    if shape.variant not in VARIANTS:
        raise UserError(f"variant {shape.variant!r} is not one of {', '.join(VARIANTS)}")
    extra = {}
    if shape.variant == "dflash2":
        for name in DFLASH2_KEYS:
            if getattr(shape, name) < 1:
                raise UserError(f"{name} is {getattr(shape, name)}, expected >= 1")
            extra[name] = getattr(shape, name)
        if tcfg.hidden_size % shape.conv_group_size:
            raise UserError(f"conv_group_size {shape.conv_group_size} does not divide the hidden size "
                            f"{tcfg.hidden_size}")
        if shape.selector_top_k > tcfg.vocab_size:
            raise UserError(f"selector_top_k {shape.selector_top_k} exceeds the vocabulary ({tcfg.vocab_size})")
    decoder = {f.name: getattr(tcfg, f.name) for f in fields(DecoderConfig)}  # the target's widths, heads, norms, RoPE
    decoder.update(intermediate_size=shape.intermediate_size or tcfg.intermediate_size, num_layers=shape.num_layers)
    return DraftConfig(
        **decoder,
        block_size=shape.block_size,
        target_layer_ids=tuple(sorted(ids)),
        mask_token_id=mask_token_id,
        num_target_layers=tcfg.num_layers,
        vocab_size=tcfg.vocab_size,
        **extra,
    )


def new_drafter(target: Target, shape: DrafterShape, mask_token_id: int, seed: int = 0) -> DFlashDraft:
    """A fresh fp32 drafter for `target`.

    init "random": normal(0, 0.02) matrices, unit norms, final norm = the target's; DFlash2's
    convolutions start as the identity (so the selector starts as near-argmax).
    init "target": additionally, drafter layer i starts as a copy of target layer
    L - n + i (the last n layers: they already map a residual stream to the LM head's
    space and carry the target's attention patterns), and `fc` starts as the selector of
    the deepest feature with `hidden_norm` = the input norm of the layer that consumes it,
    so the first drafter layer's context K/V start as (close to) that target layer's own.
    Layers whose shapes differ from the target's (another intermediate size) stay random."""
    cfg = draft_config(target.cfg, shape, mask_token_id)
    torch.manual_seed(seed)
    d = DFlashDraft(cfg).to(target.device)
    tl = target.layers
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
            if name.endswith("base_kernel"):  # DFlash2: start as the identity (tap 0 = 1, others 0)
                p.zero_()
                p[:, 0] = 1.0
        d.norm.weight.copy_(target.norm.weight)
        if shape.init == "target":
            first = len(tl) - cfg.num_layers
            for i, layer in enumerate(d.layers):
                src = tl[first + i].state_dict()
                own = layer.state_dict()
                if all(k in src and src[k].shape == v.shape for k, v in own.items()):
                    layer.load_state_dict(src)
            deepest = max(cfg.target_layer_ids)
            h = cfg.hidden_size
            d.fc.weight.zero_()
            col = cfg.target_layer_ids.index(deepest) * h
            d.fc.weight[:, col : col + h] = torch.eye(h)
            if deepest + 1 < len(tl):
                d.hidden_norm.weight.copy_(tl[deepest + 1].input_layernorm.weight)
    return d.float()
