"""Settings of drafter training (torch-free, so the CLI can build its parser quickly)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_dflash.errors import UserError


@dataclass(frozen=True)
class DrafterShape:
    """What the user chooses about a new drafter; the rest is copied from the target."""

    num_layers: int = 1
    block_size: int = 16
    intermediate_size: int | None = None  # default: the target's
    target_layer_ids: tuple[int, ...] | None = None  # default: z-lab's rule for 3 features
    # "random" (the published recipe); "target": layers copied from the target's last layers.
    # On the tiny stdlib pair "target" learned more slowly (in-loop tau 2.1 vs 3.2 after 200 steps).
    init: str = "random"
    # "dflash" or "dflash2" (z-lab's DFlash2DraftModel: convolutions around every sublayer and
    # the candidate selector); the four DFlash2 settings below are ignored for "dflash".
    # z-lab's published DFlash2 uses kernel 2, group 16, rank 256, top-k 16 (vocabulary 202k).
    variant: str = "dflash"
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 64
    selector_top_k: int = 16


INITS = ("target", "random")
VARIANTS = ("dflash", "dflash2")

SCHEDULES = ("wsd", "cosine", "constant")


def default_gamma(block_size: int) -> float:
    """Slot-weight decay of the published recipe: 7 at B=16, 5 at B=10, 4 at B=8."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, round(0.45 * block_size)))


# Not merged with train/target.py's configs: TargetModelConfig only looks alike (a model shape); TrainConfig shares
# field names but not all defaults (lr, warm-up, weight decay), and a common base would reorder saved train_config.
@dataclass(frozen=True)
class DrafterTrainConfig:
    steps: int = 4000
    seqs_per_step: int = 8  # sequences per optimizer step (one target pass each)
    anchors: int = 64  # blocks per sequence
    gamma: float | None = None  # slot-weight decay; default from the block size
    lr: float = 1e-3
    min_lr_ratio: float = 0.05  # final lr = lr * min_lr_ratio
    schedule: str = "wsd"  # warm-up, constant, linear decay over the last decay_fraction of steps
    decay_fraction: float = 0.2
    warmup_steps: int = 100
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    bf16: bool = True  # bf16 autocast for the target features and the drafter (fp32 master weights)
    seed: int = 0
    eval_every: int = 250  # steps between in-loop acceptance evaluations (0 = only at the end)
    eval_prompts: int = 8  # held-out prompts decoded per evaluation
    eval_new_tokens: int = 128
    ckpt_every: int = 100
    log_every: int = 25
    selector_weight: float = 1.0  # DFlash2: weight of the selector's loss next to the draft CE


def check_train_config(cfg: DrafterTrainConfig) -> None:
    """Settings no training can run with: a UserError naming the option."""
    rules = ((("steps", "seqs_per_step", "anchors", "lr", "eval_prompts", "eval_new_tokens", "ckpt_every", "log_every",
               "gamma"), "> 0", lambda v: v > 0),
             (("warmup_steps", "weight_decay", "eval_every", "selector_weight"), ">= 0", lambda v: v >= 0),
             (("min_lr_ratio", "decay_fraction"), "in [0, 1]", lambda v: 0 <= v <= 1))
    for names, want, ok in rules:
        for name in names:
            value = getattr(cfg, name)
            if value is not None and not (math.isfinite(value) and ok(value)):
                raise UserError(f"--{name.replace('_', '-')}: {value} (expected {want})")


# Fields that may change when a run is resumed (the schedule is a function of `steps`, so
# raising it extends a run: a WSD schedule then simply stays in its constant phase longer).
RESUME_FREE = {"steps", "eval_every", "eval_prompts", "eval_new_tokens", "ckpt_every", "log_every"}


def lr_at(cfg: DrafterTrainConfig, step: int) -> float:
    """Learning rate of optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "cosine":
        p = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * p))
    decay_start = cfg.steps - int(cfg.decay_fraction * cfg.steps)
    if step < decay_start:
        return cfg.lr
    p = min(1.0, (step - decay_start + 1) / max(1, cfg.steps - decay_start))
    return cfg.lr + (floor - cfg.lr) * p
