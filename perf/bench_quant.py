"""What FP8 and NVFP4 weights do to DFlash: tau and greedy agreement against bf16, one run.

    python -m trtllm_dflash.perf.bench_quant [--target DIR --drafter DIR] [--prompts 4]
        [--prompt-len 64] [--max-new-tokens 48] [--block-size B] [--dtype float32] [--json]

The pair: --target/--drafter, else the shipped tiny pair (trtllm_dflash/assets/tiny-pystd)
when it is installed, else random-weight tiny models (bench_decode.random_pair); the output
says which. Random drafters accept almost nothing (tau ~ 1), so only a trained pair shows
how quantization moves tau.

Rows are (target format, drafter format) over {bf16, fp8, nvfp4}: bf16 both, each format on
the target alone, on the drafter alone, and on both. bf16 means the weights rounded to bf16;
fp8 / nvfp4 quantize those bf16 weights with the exact formats (formats/quant.py) and the
checkpoints' scale sharing (quantize/emulate.py), then dequantize: weight-only emulation,
computed in --dtype (float32 by default, so the only difference between rows is the weights).
The LM head and embedding stay bf16 (they are excluded from quantization, as in ModelOpt).

Columns, over all prompts (greedy):
  tau          tokens committed per target verify pass in dflash mode (counts the bonus)
  d_tau        tau - tau of the bf16 row
  token_agree  fraction of generated positions whose token equals the bf16 target's greedy output
  prefix_agree mean over prompts of (tokens before the first difference) / max_new_tokens
  lossless     dflash output == the same (quantized) target's plain greedy output, every prompt
A drafter-only row must keep agreement 1.0 (the target is unchanged and DFlash is lossless).
The last stdout line with --json is one JSON object: source, prompts, settings, rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from importlib import resources
from pathlib import Path

import torch

from trtllm_dflash.quantize.emulate import fake_quantize_
from trtllm_dflash.reference import generate, load_pair, pooled_tau

ROWS = [("bf16", "bf16"), ("fp8", "bf16"), ("nvfp4", "bf16"), ("bf16", "fp8"), ("bf16", "nvfp4"), ("fp8", "fp8"),
        ("nvfp4", "nvfp4")]


def shipped_pair() -> tuple[Path, Path] | None:
    root = Path(str(resources.files("trtllm_dflash"))) / "assets" / "tiny-pystd"
    if (root / "target" / "config.json").is_file() and (root / "drafter" / "config.json").is_file():
        return root / "target", root / "drafter"
    return None


def _as_format(model: torch.nn.Module, fmt: str, drafter: bool, dtype: torch.dtype) -> torch.nn.Module:
    """A copy with bf16-rounded weights, then (fp8 / nvfp4) weight-only quantization."""
    m = copy.deepcopy(model).to(torch.bfloat16)
    if fmt != "bf16":
        fake_quantize_(m, fmt, drafter=drafter)
    return m.to(dtype)


def _decode(target, drafter, prompts, n, mode, block):
    gens = generate(target, drafter, prompts, n, mode=mode, block_size=block, stop_token_ids=[])
    return [g.tokens for g in gens], pooled_tau(gens)


def _agreement(tokens, reference, n):
    same = sum(a == b for t, r in zip(tokens, reference) for a, b in zip(t, r))
    total = sum(len(r) for r in reference)
    prefix = 0.0
    for t, r in zip(tokens, reference):
        k = next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), min(len(t), len(r)))
        prefix += k / n
    return same / total, prefix / len(reference)


def bench(target_dir=None, drafter_dir=None, *, prompts=4, prompt_len=64, max_new_tokens=48, block_size=None,
          dtype="float32", seed=0, progress=True) -> dict:
    from trtllm_dflash.perf.bench_decode import random_pair
    from trtllm_dflash.prompts.sources import heldout_token_prompts as heldout_prompts

    dt = getattr(torch, dtype)
    if target_dir or drafter_dir:
        target, drafter = load_pair(target_dir, drafter_dir, torch.float32)
        source = f"given pair: {target_dir} + {drafter_dir}"
    elif (pair := shipped_pair()) is not None:
        target_dir, drafter_dir = pair
        target, drafter = load_pair(*pair, torch.float32)
        source = "shipped tiny pair: trtllm_dflash/assets/tiny-pystd"
    else:
        target, drafter = random_pair(seed, torch.float32)
        source = ("random tiny models (the shipped tiny-pystd pair is not installed): Qwen3 8L x 256 + 2-layer "
                  "drafter; tau ~ 1")
    block = block_size or drafter.block_size
    ps = heldout_prompts(target_dir, prompts, prompt_len) if target_dir else None
    prompt_source = "the shipped held-out Python text (prompts/data)" if ps is not None else "random token ids"
    if ps is None:
        g = torch.Generator().manual_seed(seed)
        ps = [torch.randint(0, target.cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(prompts)]

    targets = {f: _as_format(target, f, False, dt) for f in ("bf16", "fp8", "nvfp4")}
    drafters = {f: _as_format(drafter, f, True, dt) for f in ("bf16", "fp8", "nvfp4")}
    from rich.progress import Progress

    rows, plain = [], {}
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("decoding", total=3 + len(ROWS))
        for f, t in targets.items():  # each target's own greedy output (no drafter)
            plain[f], _ = _decode(t, None, ps, max_new_tokens, "ar", block)
            bar.advance(task)
        for tf, df in ROWS:
            tokens, tau = _decode(targets[tf], drafters[df], ps, max_new_tokens, "dflash", block)
            token_agree, prefix_agree = _agreement(tokens, plain["bf16"], max_new_tokens)
            rows.append({"target": tf, "drafter": df, "tau": tau, "token_agree": token_agree,
                         "prefix_agree": prefix_agree, "lossless": tokens == plain[tf]})
            bar.advance(task)
    base = rows[0]["tau"]
    for r in rows:
        r["d_tau"] = r["tau"] - base
    return {
        "source": source,
        "prompts": {"count": len(ps), "prompt_len": prompt_len, "from": prompt_source},
        "settings": {"max_new_tokens": max_new_tokens, "block_size": block, "dtype": dtype, "greedy": True,
                     "threads": torch.get_num_threads(), "quantization": "weight-only emulation, exact formats"},
        "rows": rows,
    }


def print_report(res: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    s, pr = res["settings"], res["prompts"]
    t = Table(title=f"{res['source']}\n{pr['count']} prompts x {pr['prompt_len']} tokens ({pr['from']}), "
                    f"{s['max_new_tokens']} new, block {s['block_size']}, {s['dtype']} compute, greedy")
    for col in ("target", "drafter", "tau", "d_tau", "token_agree", "prefix_agree", "lossless"):
        t.add_column(col, justify="left" if col in ("target", "drafter") else "right")
    for r in res["rows"]:
        t.add_row(r["target"], r["drafter"], f"{r['tau']:.3f}", f"{r['d_tau']:+.3f}", f"{r['token_agree']:.3f}",
                  f"{r['prefix_agree']:.3f}", "yes" if r["lossless"] else "NO")
    Console(file=file).print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.perf.bench_quant", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, default=None)
    p.add_argument("--drafter", type=Path, default=None)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    args = p.parse_args(argv)
    if (args.target is None) != (args.drafter is None):
        p.error("give both --target and --drafter, or neither")
    if args.threads:
        torch.set_num_threads(args.threads)
    res = bench(args.target, args.drafter, prompts=args.prompts, prompt_len=args.prompt_len,
                max_new_tokens=args.max_new_tokens, block_size=args.block_size, dtype=args.dtype, seed=args.seed,
                progress=sys.stderr.isatty())
    print_report(res)
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
