"""`trtllm-dflash train-drafter`: train a DFlash drafter for a target (CPU or GPU).

  trtllm-dflash train-drafter --target DIR --data DIR --out DIR
      [--layers 1] [--block-size 16] [--intermediate-size I] [--target-layer-ids 1,5,9]
      [--init random|target] [--variant dflash|dflash2 [--conv-kernel-size 2] [--conv-group-size 16]
      [--selector-rank 64] [--selector-top-k 16] [--selector-weight 1]]
      [--gamma G] [--anchors 64] [--seqs-per-step 8] [--steps 4000]
      [--lr 1e-3] [--schedule wsd|cosine|constant] [--device cpu|cuda] [--threads T]
      [--ckpt-dir DIR] [--resume] [--max-minutes M] [--eval-every 250] [--dtype bfloat16]

--target is an HF checkpoint directory (Qwen3 / Llama / Qwen3-MoE); --data is a directory
written by `python -m trtllm_dflash.train.data` (the target's greedy continuations, with
held-out prompts for the in-loop evaluation). The recipe is described in
trtllm_dflash/train/drafter_loss.py. Checkpoints go to --ckpt-dir (default OUT.ckpt); --resume
continues from the last one; --max-minutes stops this session with a checkpoint. At the
end the drafter is written to --out in the z-lab layout (config.json + model.safetensors,
--dtype), with training.json (settings, loss and in-loop tau history).
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import fields
from pathlib import Path

from trtllm_dflash.errors import UserError


def _ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices like 1,5,9, got {text!r}") from None


def _training_arguments(t: argparse._ArgumentGroup, d, schedules) -> None:
    """The "training" group: DrafterTrainConfig's fields, its defaults shown."""
    t.add_argument("--steps", type=int, default=d.steps)
    t.add_argument("--seqs-per-step", type=int, default=d.seqs_per_step,
                   help="sequences per step (one target pass each)")
    t.add_argument("--anchors", type=int, default=d.anchors, help="random anchors (blocks) per sequence")
    t.add_argument("--gamma", type=float, default=None,
                   help="slot weight exp(-(k-1)/gamma); default 7 at B=16, 4 at B=8")
    t.add_argument("--lr", type=float, default=d.lr)
    t.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio)
    t.add_argument("--schedule", choices=schedules, default=d.schedule,
                   help="wsd: warm-up, constant, linear decay over the last --decay-fraction (default)")
    t.add_argument("--decay-fraction", type=float, default=d.decay_fraction)
    t.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    t.add_argument("--weight-decay", type=float, default=d.weight_decay)
    t.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32 (default: bf16 autocast)")
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--selector-weight", type=float, default=d.selector_weight,
                   help="dflash2: weight of the selector's loss next to the draft cross-entropy (default 1)")
    t.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between in-loop tau evaluations")
    t.add_argument("--eval-prompts", type=int, default=d.eval_prompts)
    t.add_argument("--eval-new-tokens", type=int, default=d.eval_new_tokens)
    t.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    t.add_argument("--log-every", type=int, default=d.log_every)


def register(sub: argparse._SubParsersAction) -> None:
    from trtllm_dflash.train.drafter_config import INITS, SCHEDULES, VARIANTS, DrafterShape, DrafterTrainConfig

    d, shape = DrafterTrainConfig(), DrafterShape()
    p = sub.add_parser("train-drafter", help="train a DFlash drafter for a target (the published recipe; CPU or GPU)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, required=True, help="target: HF checkpoint directory")
    p.add_argument("--data", type=Path, required=True,
                   help="training data directory (python -m trtllm_dflash.train.data)")
    p.add_argument("--out", type=Path, required=True, help="output drafter directory (z-lab layout)")
    g = p.add_argument_group("drafter shape")
    g.add_argument("--layers", type=int, default=1, help="drafter decoder layers (default 1)")
    g.add_argument("--block-size", type=int, default=16, help="block size B: anchor + B-1 mask slots (default 16)")
    g.add_argument("--intermediate-size", type=int, default=None, help="drafter FFN width (default: the target's)")
    g.add_argument("--target-layer-ids", type=_ids, default=None, metavar="I,J,K",
                   help="target layers whose outputs feed the drafter (default: 3 spread over the depth)")
    g.add_argument("--init", choices=INITS, default="random",
                   help="random: from scratch (default, the published recipe); target: start from the target's last "
                        "layers")
    g.add_argument("--variant", choices=VARIANTS, default="dflash",
                   help="dflash (default) or dflash2: z-lab's DFlash2 (convolutions around every sublayer, candidate "
                        "selector)")
    for name, what in (("conv_kernel_size", "DFlash2 convolution taps"),
                       ("conv_group_size", "channels per dynamic tap"),
                       ("selector_rank", "rank of the selector's codebooks"),
                       ("selector_top_k", "candidates per slot the selector chooses among")):
        g.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(shape, name),
                       help=f"{what} (dflash2; default {getattr(shape, name)})")
    _training_arguments(p.add_argument_group("training"), d, SCHEDULES)
    r = p.add_argument_group("run")
    r.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1 ...")
    r.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    r.add_argument("--ckpt-dir", type=Path, default=None, help="checkpoint directory (default: OUT.ckpt)")
    r.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --ckpt-dir")
    r.add_argument("--max-minutes", type=float, default=None,
                   help="stop this session (with a checkpoint) after M minutes")
    r.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="dtype of the saved drafter")
    r.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(run=run)


def run(args) -> int:
    import hashlib
    import json

    import torch

    from trtllm_dflash.reference.loading import load_target
    from trtllm_dflash.train.data import load_continuations
    from trtllm_dflash.train.drafter import export, train
    from trtllm_dflash.train.drafter_config import DrafterShape, DrafterTrainConfig, check_train_config

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {args.device}: CUDA is not available on this machine (use --device cpu)")
    cfg = DrafterTrainConfig(**{f.name: getattr(args, f.name, f.default) for f in fields(DrafterTrainConfig)})
    check_train_config(cfg)
    shape = DrafterShape(args.layers, args.block_size, args.intermediate_size, args.target_layer_ids, args.init,
                         args.variant, args.conv_kernel_size, args.conv_group_size, args.selector_rank,
                         args.selector_top_k)
    data = load_continuations(args.data)
    meta = data["meta"]
    target = load_target(args.target, torch.float32, str(dev))
    weights = args.target / "model.safetensors"
    sha = meta.get("target_weights_sha256")
    if sha and weights.is_file() and hashlib.sha256(weights.read_bytes()).hexdigest() != sha:
        print(f"warning: {args.data} was generated by a target whose weights differ from {weights} "
              "(the drafter learns the other target's greedy text)", file=sys.stderr)
    mask = meta.get("mask_token_id")
    if mask is None:
        raise UserError(f"{args.data / 'meta.json'}: no mask_token_id (the tokenizer's mask token)")
    ckpt_dir = args.ckpt_dir or args.out.with_name(args.out.name + ".ckpt")
    log = functools.partial(print, file=sys.stderr, flush=True)
    log(f"target {args.target} ({target.cfg.num_layers} layers, hidden {target.cfg.hidden_size}); "
        f"data {data['input_ids'].shape[0]} sequences x {data['input_ids'].shape[1]} tokens; device {dev}")
    res = train(target, data["input_ids"], data["loss_mask"], data["prompt_ids"], data["greedy_ids"], shape, int(mask),
                cfg, ckpt_dir, resume=args.resume,
                max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
                progress=not args.no_progress, log=log)
    if not res.done:
        return 0
    n_params = sum(p.numel() for p in res.drafter.parameters())
    evals = [h for h in res.history if "eval_tau" in h]
    losses = [h for h in res.history if "loss" in h]
    summary = {
        "target": str(args.target.name),
        "data": {k: meta.get(k) for k in ("num_seqs", "prompt_len", "gen_len", "seed")},
        "shape": shape.__dict__, "train_config": cfg.__dict__, "params": n_params, "steps": res.step,
        "train_seconds": round(res.elapsed, 1), "final_loss_ema": losses[-1]["loss_ema"] if losses else None,
        "final_eval": evals[-1] if evals else None, "history": res.history, "torch": torch.__version__,
    }
    export(res.drafter, args.out, getattr(torch, args.dtype), summary)
    ev = summary["final_eval"] or {}
    log(f"done: {res.step} steps in {res.elapsed:.0f}s, {n_params:,} params; in-loop tau {ev.get('eval_tau')} "
        f"(teacher-forced {ev.get('eval_tau_teacher_forced')}) -> {args.out}")
    print(json.dumps({"out": str(args.out), "steps": res.step, "params": n_params,
                      "train_seconds": round(res.elapsed, 1),
                      "tau": ev.get("eval_tau"), "tau_teacher_forced": ev.get("eval_tau_teacher_forced")}))
    return 0
