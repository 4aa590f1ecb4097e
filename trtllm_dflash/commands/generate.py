"""`trtllm-dflash generate`: decode one prompt with the reference backend.

  trtllm-dflash generate --target DIR --drafter DIR (--prompt TEXT | --prompt-ids 1,2,3)
      --max-new-tokens N [--mode ar|dflash|ddtree] [--temperature T] [--top-p P] [--top-k K]
      [--seed S] [--block-size B] [--ddtree-budget N] [--json]
  trtllm-dflash generate --recipe RECIPE ...      (target, drafter, block size, budget from the recipe)
  trtllm-dflash generate --checkpoint DIR [--tp N] ...   (a convert / quantize output, N processes)

--target is an HF model directory (it may carry a tokenizer; --prompt needs one), --drafter
a z-lab DFlash directory (not needed for --mode ar). Without --json the decoded text is
streamed to stdout as rounds commit, and a stats line goes to stderr. With --json one object
is printed: tokens, text (null without a tokenizer), tau, rounds, accepted_per_round,
finish_reason and timings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from trtllm_dflash.errors import UserError

MODES = ("ar", "dflash", "ddtree")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode a prompt with the reference DFlash backend (CPU or any torch device)")
    p.add_argument("--target", type=Path, help="target: HF model directory (config.json + *.safetensors)")
    p.add_argument("--drafter", type=Path, help="drafter: z-lab DFlash directory (not needed for --mode ar)")
    p.add_argument("--recipe", help="recipe YAML giving target, drafter, block size and DDTree budget")
    p.add_argument("--checkpoint", type=Path,
                   help="a convert / quantize output (TensorRT-LLM layout) instead of --target/--drafter")
    p.add_argument("--tp", type=int, default=None, help="--checkpoint: tensor-parallel processes (default: its tp)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer in the target directory)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma-separated: 1,2,3")
    p.add_argument("--max-new-tokens", type=int, required=True, metavar="N")
    p.add_argument("--mode", choices=MODES, default="dflash", help="ar = target alone (baseline); default dflash")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--block-size", type=int, default=None, metavar="B", help="default: the drafter's (or the recipe's)")
    p.add_argument("--ddtree-budget", type=int, default=None, metavar="N", help="tree nodes per round; default B-1")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(run=run)


def _paths(args) -> tuple[Path, Path | None, int | None, int | None, tuple[int, str]]:
    """(target or tokenizer directory, drafter or checkpoint directory, block size, DDTree budget,
    (longest prompt + output, what sets that limit))."""
    from trtllm_dflash.reference.config import TargetConfig, read_json

    block, budget = args.block_size, args.ddtree_budget
    if args.checkpoint is not None:
        from trtllm_dflash.runtime.checkpoint import checkpoint_paths, read_checkpoint

        limit = read_checkpoint(args.checkpoint).target_cfg.max_position_embeddings
        return (*checkpoint_paths(args), (limit, f"the target's max_position_embeddings ({args.checkpoint})"))
    if args.recipe is None:
        if args.target is None:
            raise UserError("give --target DIR (and --drafter DIR), or --recipe RECIPE")
        cfg = TargetConfig.from_dict(read_json(args.target / "config.json"), f"--target {args.target}/config.json")
        limit = (cfg.max_position_embeddings, "the target's max_position_embeddings")
        return args.target, args.drafter, block, budget, limit
    if args.target is not None or args.drafter is not None:
        raise UserError("--recipe replaces --target/--drafter; give one or the other")
    from trtllm_dflash.recipe import load_recipe

    # Deployment rules (memory, build limits) do not apply to one reference decode; the
    # checkpoints themselves are validated when they are loaded.
    recipe = load_recipe(args.recipe, check_rules=False)
    for name, src in (("target", recipe.target), ("drafter", recipe.drafter)):
        if src.path is None or not src.path.is_dir():
            raise UserError(f"{args.recipe}: {name}.source {src.source!r} is not a local directory (the reference "
                            "backend reads local checkpoints)")
    spec = recipe.speculative
    return (recipe.target.path, recipe.drafter.path, block or spec.block_size, budget or spec.ddtree_budget,
            (recipe.build.max_seq_len, f"build.max_seq_len of {args.recipe}"))


def _tokenizer(target_dir: Path):
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)


def _prompt_ids(args, tok) -> list[int]:
    if args.prompt_ids is not None:
        try:
            ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--prompt-ids {args.prompt_ids!r}: expected comma-separated integers, e.g. "
                            "1,2,3") from None
        if not ids:
            raise UserError("--prompt-ids is empty")
        return ids
    if tok is None:
        raise UserError(f"--prompt needs a tokenizer, and the target directory {args.target} has none (no "
                        "tokenizer.json or tokenizer_config.json); use --prompt-ids")
    ids = tok(args.prompt)["input_ids"]  # with the tokenizer's own special tokens (e.g. Llama's BOS)
    if not ids:
        raise UserError("--prompt encodes to zero tokens")
    return ids


def run(args: argparse.Namespace) -> int:
    from trtllm_dflash.reference import SamplingParams

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: expected at least 1")
    target_dir, drafter_dir, block, budget, (limit, what) = _paths(args)
    args.target = target_dir
    if args.mode != "ar" and drafter_dir is None:
        raise UserError(f"--mode {args.mode} needs --drafter DIR")
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    tok = _tokenizer(target_dir)
    prompt = _prompt_ids(args, tok)
    if len(prompt) + args.max_new_tokens > limit:
        raise UserError(f"--max-new-tokens {args.max_new_tokens} with a prompt of {len(prompt)} tokens exceeds {what}, "
                        f"{limit}: at most {max(0, limit - len(prompt))} new tokens")
    steps = _steps(args, target_dir, drafter_dir, prompt, block, budget, sampling)  # loads the models
    t0 = time.perf_counter()
    records, tokens, shown = _stream(args, tok, steps)
    stats = _stats(records, tokens, time.perf_counter() - t0)
    if args.json:
        text = tok.decode(tokens, skip_special_tokens=True) if tok is not None else None
        print(json.dumps({"mode": args.mode, "prompt_ids": prompt, "tokens": tokens, "text": text, **stats}))
        return 0
    if tok is not None and shown != tok.decode(tokens, skip_special_tokens=True):
        sys.stdout.write(tok.decode(tokens, skip_special_tokens=True)[len(shown):])
    print()
    speed = stats["decode_tokens_per_s"]
    print(f"[{args.mode}] {len(tokens)} tokens, {stats['rounds']} rounds, tau {stats['tau']:.2f}, "
          f"{'-' if speed is None else f'{speed:.1f}'} tok/s after prefill", file=sys.stderr)
    return 0


def _steps(args, target_dir: Path, drafter_dir: Path | None, prompt: list[int], block, budget, sampling):
    """The decode loop's rounds for `prompt`: over a checkpoint (tp processes) or a loaded pair."""
    import torch

    from trtllm_dflash.reference import generate_steps, load_pair, load_target

    dtype = getattr(torch, args.dtype)
    if args.checkpoint is not None:  # each tensor-parallel process loads its own shard
        from trtllm_dflash.runtime.checkpoint_runner import checkpoint_steps

        return checkpoint_steps(args.checkpoint, [prompt], args.max_new_tokens, tp=args.tp, dtype=dtype,
                                device=args.device, mode=args.mode, block_size=block, ddtree_budget=budget,
                                sampling=sampling)
    if args.mode == "ar" and drafter_dir is None:
        target, drafter = load_target(target_dir, dtype, args.device), None
    else:
        target, drafter = load_pair(target_dir, drafter_dir, dtype, args.device)
    return generate_steps(target, drafter, [prompt], args.max_new_tokens, mode=args.mode, block_size=block,
                          ddtree_budget=budget, sampling=sampling)


def _stream(args, tok, steps) -> tuple[list, list[int], str]:
    """Run the rounds, printing the text as it grows (not with --json). Returns (records, tokens,
    the text shown)."""
    records, tokens, shown = [], [], ""
    for rec in steps:
        records.append(rec)
        tokens += rec.tokens[0]
        if args.json:
            continue
        if tok is None:
            print(" ".join(map(str, rec.tokens[0])), end=" ", flush=True)
            continue
        text = tok.decode(tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next round
            continue
        sys.stdout.write(text[len(shown):] if text.startswith(shown) else "\n" + text)
        sys.stdout.flush()
        shown = text
    return records, tokens, shown


def _stats(records: list, tokens: list[int], wall: float) -> dict:
    rounds = [len(r.tokens[0]) for r in records[1:]]
    decode_time = wall - records[0].t_verify - records[0].t_overhead
    return {
        "tau": sum(rounds) / len(rounds) if rounds else 0.0,
        "rounds": len(rounds),
        "accepted_per_round": rounds,
        "finish_reason": records[-1].finished[0],
        "t_prefill": records[0].t_verify,
        "t_draft": sum(r.t_draft for r in records),
        "t_verify": sum(r.t_verify for r in records[1:]),
        "t_overhead": sum(r.t_overhead for r in records),
        "decode_tokens_per_s": (len(tokens) - 1) / decode_time if decode_time > 0 and len(tokens) > 1 else None,
    }
