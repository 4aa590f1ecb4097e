"""Train a DFlash drafter for a given target: the published recipe, in plain PyTorch.

`train` runs the loop over the target's greedy continuations (train/data.py writes them): a
fresh drafter (drafter_init.py), per step the frozen target's features and the block loss of
sampled anchors (drafter_loss.py: the recipe, its attention masks and DFlash2's selector loss),
AdamW on the schedule of drafter_config.py, an in-loop evaluation with the reference decode
loop, and checkpoints a later session resumes from exactly. `export` writes the z-lab layout.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.reference.config import DraftConfig
from trtllm_dflash.reference.draft import DFlashDraft
from trtllm_dflash.reference.target import Target
from trtllm_dflash.train.common import adamw_decay_groups, atomic_dir, check_resume, load_checkpoint, optimizer_step

# isort: split
from trtllm_dflash.train.common import progress_bar, restore, save_checkpoint, set_lr
from trtllm_dflash.train.drafter_config import (
    RESUME_FREE,
    SCHEDULES,
    DrafterShape,
    DrafterTrainConfig,
    default_gamma,
    lr_at,
)
from trtllm_dflash.train.drafter_init import new_drafter
from trtllm_dflash.train.drafter_loss import block_loss, freeze, sample_anchors, target_features


@dataclass
class EvalResult:
    tau: float  # in-loop: committed tokens per target verify pass, decoding held-out prompts
    tau_teacher_forced: float  # the same drafter scored at every position of the target's greedy text
    identical: int  # prompts whose dflash output equals the target's greedy continuation
    prompts: int
    seconds: float


@torch.no_grad()
def evaluate(drafter: DFlashDraft, target: Target, prompt_ids: torch.Tensor, greedy_ids: torch.Tensor,
             new_tokens: int, gamma: float) -> EvalResult:
    """Decode the prompts with the reference loop (greedy, batch) and measure tau; also the
    teacher-forced estimate (64 random anchors per prompt in the target's own greedy text)
    for comparison: it overstates tau, because the decode loop spends most of its rounds
    in the hard stretches."""
    from trtllm_dflash.reference.generate import generate
    from trtllm_dflash.reference.records import pooled_tau

    t0 = time.perf_counter()
    was = drafter.training
    drafter.eval()
    if len(greedy_ids) != len(prompt_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(greedy_ids)} greedy continuations")
    n = min(new_tokens, greedy_ids.shape[1])
    gens = generate(target, drafter, prompt_ids.tolist(), n, mode="dflash", stop_token_ids=[])
    identical = sum(g.tokens == greedy_ids[i, :n].tolist() for i, g in enumerate(gens))
    ids = torch.cat([prompt_ids, greedy_ids[:, :n]], dim=1).to(target.device)
    lm = torch.zeros_like(ids)
    lm[:, prompt_ids.shape[1] :] = 1
    feats = target_features(target, ids, drafter.target_layer_ids)
    anchors, valid = sample_anchors(lm, 64, drafter.block_size, torch.Generator().manual_seed(0))
    tf = block_loss(drafter, target, feats, ids, lm, anchors, valid, gamma).tau_estimate
    drafter.train(was)
    # first round commits 1 (the prefill token) and is not a verify pass: stats exclude it
    return EvalResult(pooled_tau(gens), tf, identical, len(gens), time.perf_counter() - t0)


@dataclass
class TrainResult:
    drafter: DFlashDraft
    step: int
    done: bool  # reached cfg.steps (False: stopped by the time budget, resumable)
    history: list = field(default_factory=list)  # logged steps and evaluations, all sessions
    elapsed: float = 0.0  # training seconds, all sessions


def _check_resume(saved: dict, dcfg: DraftConfig, cfg: DrafterTrainConfig, path) -> None:
    from dataclasses import asdict

    check_resume(saved["draft_config"], dcfg.to_dict(), path, "drafter config field", rerun_with="the same shape")
    # settings added since a checkpoint was written take their defaults (the behaviour it was trained with)
    train_config = {**asdict(DrafterTrainConfig()), **saved["train_config"]}
    check_resume(train_config, asdict(cfg), path, "training setting", free=RESUME_FREE)


def train(
    target: Target,
    input_ids: torch.Tensor,  # [N, S] prompt + target greedy continuation
    loss_mask: torch.Tensor,  # [N, S] 1 on generated tokens
    eval_prompts: torch.Tensor,  # [M, P] held-out prompts
    eval_greedy: torch.Tensor,  # [M, G] the target's greedy continuations of them
    shape: DrafterShape,
    mask_token_id: int,
    cfg: DrafterTrainConfig,
    ckpt_dir,
    resume: bool = False,
    max_seconds: float | None = None,
    progress: bool = True,
    log=print,
) -> TrainResult:
    """Train (or resume) a drafter for `target` (frozen) and return it in fp32.

    Every `ckpt_every` steps, and when `max_seconds` of this session have passed, a
    checkpoint (drafter, optimizer, step, RNG states, data cursor, history) is written to
    ckpt_dir/last.pt; `resume=True` continues from it and draws the same batches and
    anchors as an uninterrupted run would."""
    from dataclasses import asdict
    from pathlib import Path

    dev = target.device
    freeze(target)
    N, S = input_ids.shape
    B = shape.block_size
    if S < B + 1:
        raise UserError(f"training sequences have {S} tokens, fewer than block size + 1 = {B + 1}")
    if cfg.seqs_per_step < 1 or cfg.anchors < 1 or cfg.steps < 1:
        raise UserError("steps, seqs_per_step and anchors must be >= 1")
    if cfg.schedule not in SCHEDULES:
        raise UserError(f"schedule {cfg.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if int(input_ids.max()) >= target.cfg.vocab_size:
        raise UserError(f"training data has token id {int(input_ids.max())}, outside the target's vocabulary "
                        f"(vocab_size {target.cfg.vocab_size}); was it generated with another tokenizer?")
    gamma = cfg.gamma or default_gamma(B)
    drafter = new_drafter(target, shape, mask_token_id, cfg.seed).to(dev).train()
    dcfg = drafter.cfg
    opt = adamw_decay_groups(drafter, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    anchor_gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, cursor, history, elapsed_before = 0, 0, [], 0.0
    ckpt_dir = Path(ckpt_dir)
    ckpt = ckpt_dir / "last.pt"
    resumable = {"drafter": drafter, "optimizer": opt, "anchor_rng": anchor_gen}  # saved and restored by name
    if resume:
        state = load_checkpoint(ckpt)
        _check_resume(state, dcfg, cfg, ckpt)
        restore(state, resumable)
        step, cursor, history, elapsed_before = state["step"], state["cursor"], state["history"], state["elapsed"]
        log(f"resumed from {ckpt} at step {step} ({elapsed_before:.0f}s trained so far)")

    t_start = time.perf_counter()

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - t_start

    def save() -> None:
        save_checkpoint(ckpt, resumable, step=step, cursor=cursor, history=history, elapsed=elapsed(),
                        draft_config=dcfg.to_dict(), train_config=asdict(cfg), shape=asdict(shape))

    # evaluation prompts: evenly spaced over the held-out set (it is ordered by file)
    eval_rows = torch.linspace(0, len(eval_prompts) - 1, min(cfg.eval_prompts, len(eval_prompts))).round().long()

    def order(epoch: int) -> torch.Tensor:
        return torch.randperm(N, generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch))

    def run_eval() -> EvalResult:
        r = evaluate(drafter, target, eval_prompts[eval_rows], eval_greedy[eval_rows], cfg.eval_new_tokens, gamma)
        history.append({"step": step, "elapsed": round(elapsed(), 1), "eval_tau": round(r.tau, 3),
                        "eval_tau_teacher_forced": round(r.tau_teacher_forced, 3),
                        "eval_identical": f"{r.identical}/{r.prompts}"})
        log(f"eval step {step}: in-loop tau {r.tau:.2f} (teacher-forced estimate {r.tau_teacher_forced:.2f}), "
            f"greedy-identical {r.identical}/{r.prompts}, {r.seconds:.1f}s")
        return r

    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    # Features come from a bf16 copy of the target (its KV cache is in the weights' dtype);
    # the fp32 target serves the embedding, the LM head and the in-loop evaluation.
    feature_target = freeze(copy.deepcopy(target).to(torch.bfloat16)) if cfg.bf16 else target
    bar = progress_bar("drafter",
                       "loss {task.fields[loss]:.3f} acc1 {task.fields[acc1]:.2f} tau~ {task.fields[tf]:.2f} "
                       "tau {task.fields[tau]:.2f} {task.fields[sps]:.2f}s/step", progress)
    last_tau = history[-1]["eval_tau"] if history and "eval_tau" in history[-1] else float("nan")
    ema = None
    with bar:
        task = bar.add_task("train", total=cfg.steps, completed=step, loss=float("nan"), acc1=0.0, tf=0.0, tau=last_tau,
                            sps=0.0)
        while step < cfg.steps:
            if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
                save()
                log(f"time budget reached at step {step}/{cfg.steps}; checkpoint {ckpt} (resume with --resume)")
                return TrainResult(drafter, step, False, history, elapsed())
            t0 = time.perf_counter()
            epoch, i = divmod(cursor, N)
            rows = order(epoch)[i : i + cfg.seqs_per_step]
            cursor += len(rows)
            ids, lm = input_ids[rows].to(dev), loss_mask[rows].to(dev)
            anchors, valid = sample_anchors(lm, cfg.anchors, B, anchor_gen)
            lr = lr_at(cfg, step)
            set_lr(opt, lr)
            feats = target_features(feature_target, ids, dcfg.target_layer_ids)
            with autocast:
                res = block_loss(drafter, target, feats, ids, lm, anchors, valid, gamma, cfg.selector_weight)
            optimizer_step(drafter, opt, res.loss, cfg.grad_clip)
            step += 1
            loss = res.loss.item()
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            acc = (res.slot_correct / res.slot_count.clamp_min(1)).tolist()
            sps = time.perf_counter() - t0
            if step % cfg.log_every == 0:
                history.append({"step": step, "elapsed": round(elapsed(), 1), "loss": round(loss, 4),
                                "loss_ema": round(ema, 4), "lr": lr, "acc": [round(a, 3) for a in acc],
                                "tau_estimate": round(res.tau_estimate, 3)})
                log(f"step {step}/{cfg.steps} loss {loss:.3f} (ema {ema:.3f}) lr {lr:.2e} slot-1 acc {acc[0]:.2f} "
                    f"tau~ {res.tau_estimate:.2f} {sps:.2f}s/step {elapsed():.0f}s")
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                last_tau = run_eval().tau
            bar.update(task, completed=step, loss=ema, acc1=acc[0], tf=res.tau_estimate, tau=last_tau, sps=sps)
            if step % cfg.ckpt_every == 0:
                save()
        run_eval()
        save()
    return TrainResult(drafter, step, True, history, elapsed())


def export(drafter: DFlashDraft, out_dir, dtype: torch.dtype = torch.bfloat16, summary: dict | None = None):
    """Write the z-lab layout (config.json + model.safetensors) atomically, plus training.json."""
    import json
    from pathlib import Path

    from trtllm_dflash.reference.loading import save_drafter

    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_drafter(drafter, tmp, dtype)
        if summary is not None:
            (tmp / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    return out_dir
