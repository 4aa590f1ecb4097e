"""A small autoregressive draft model for the baseline users would try first: HF
transformers assisted generation (`model.generate(assistant_model=...)`).

It is a real HF `Qwen3ForCausalLM` with the target's tokenizer and width, 1-2 decoder
layers, trained on the same data as the DFlash drafter (the target's greedy
continuations, next-token loss on the generated tokens) so that the comparison is fair.
It starts from the target: embedding, final norm and the first `layers` decoder layers
(a truncated target is the usual self-draft), then everything is trained.

    python -m trtllm_dflash.train.ar_draft --target DIR --data DIR --out DIR [--layers 2]
        [--steps 1500] [--batch-size 16] [--lr 1e-3] [--max-minutes M] [--threads T]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from trtllm_dflash.errors import UserError
from trtllm_dflash.train.common import optimizer_step, set_lr


def build_from_target(target, layers: int):
    """A Qwen3ForCausalLM with the target's config but `layers` layers, initialised from
    the target's embedding, final norm and first `layers` decoder layers."""
    import copy

    from transformers import Qwen3ForCausalLM

    if not 1 <= layers <= target.config.num_hidden_layers:
        raise UserError(f"--layers {layers}: expected 1..{target.config.num_hidden_layers} (the target's depth)")
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:layers]
    draft = Qwen3ForCausalLM(cfg)
    src = target.state_dict()
    state = {k: v for k, v in src.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    draft.load_state_dict(state, strict=False)  # lm_head is tied to the embedding
    return draft.float()


def next_token_loss(model, ids: torch.Tensor, loss_mask: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean CE of predicting ids[t+1] at t, over positions whose label is generated text."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # [N, S-1, V]
    ce = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    w = loss_mask[:, 1:].flatten().float()
    return (ce * w).sum() / w.sum().clamp_min(1.0)


def main(argv: list[str] | None = None) -> int:
    from trtllm_dflash.train.data import load_continuations
    from trtllm_dflash.train.target import load_target

    ap = argparse.ArgumentParser(description="Train a small AR draft model (HF assisted-generation baseline).")
    ap.add_argument("--target", type=Path, required=True, help="target HF directory")
    ap.add_argument("--data", type=Path, required=True,
                    help="drafter data directory (python -m trtllm_dflash.train.data)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--max-minutes", type=float, default=None, help="stop early (the schedule then ends abruptly)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_continuations(args.data)
    target = load_target(args.target, torch.float32)
    torch.manual_seed(args.seed)
    model = build_from_target(target, args.layers).train()
    t0 = time.perf_counter()
    step, history = _train(model, data, args, t0)
    held_loss, acc = _heldout(model.eval(), data)
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    summary = {"layers": args.layers, "params": sum(p.numel() for p in model.parameters()), "steps": step,
               "batch_size": args.batch_size, "train_seconds": round(time.perf_counter() - t0, 1),
               "heldout_loss": round(held_loss, 4), "heldout_greedy_next_token_accuracy": round(acc, 4),
               "history": history}
    (args.out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"ar-draft: {step} steps, held-out loss {held_loss:.3f}, next-token accuracy on the target's greedy text "
          f"{acc:.3f} -> {args.out}", file=sys.stderr)
    return 0


def _train(model, data: dict, args, t0: float) -> tuple[int, list[dict]]:
    """Next-token training on the target's continuations (warm-up, then cosine to 5%). Returns
    (the steps run, the loss every 50 steps)."""
    ids, lm = data["input_ids"], data["loss_mask"]
    N = ids.shape[0]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    perm, cursor, history = torch.randperm(N, generator=gen), 0, []
    step = 0
    for step in range(1, args.steps + 1):
        if args.max_minutes is not None and time.perf_counter() - t0 > 60 * args.max_minutes:
            step -= 1
            break
        if cursor + args.batch_size > N:
            perm, cursor = torch.randperm(N, generator=gen), 0
        rows = perm[cursor : cursor + args.batch_size]
        cursor += args.batch_size
        warm = min(1.0, step / args.warmup_steps)
        lr = args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        set_lr(opt, lr)
        loss = next_token_loss(model, ids[rows], lm[rows], args.bf16)
        optimizer_step(model, opt, loss, grad_clip=1.0)
        if step % 50 == 0:
            history.append({"step": step, "loss": round(loss.item(), 4), "elapsed": round(time.perf_counter() - t0, 1)})
            print(f"ar-draft step {step}/{args.steps} loss {loss.item():.3f} lr {lr:.2e} "
                  f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return step, history


@torch.no_grad()
def _heldout(model, data: dict) -> tuple[float, float]:
    """(loss, greedy next-token accuracy) on the target's own greedy continuations of held-out prompts."""
    held = torch.cat([data["prompt_ids"], data["greedy_ids"]], 1)
    hm = torch.zeros_like(held)
    hm[:, data["prompt_ids"].shape[1] :] = 1
    loss = next_token_loss(model, held, hm, False).item()
    pred = model(input_ids=held[:, :-1]).logits.argmax(-1)
    acc = ((pred == held[:, 1:]).float() * hm[:, 1:]).sum() / hm[:, 1:].sum()
    return loss, float(acc)

if __name__ == "__main__":
    raise SystemExit(main())
