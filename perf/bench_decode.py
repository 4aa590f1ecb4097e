"""Decode speed of the reference backend: ar, dflash and ddtree side by side, one run,
plus (--dflash2-drafter) a DFlash2 drafter of the same target as a fourth mode, and
(--baselines) the HF transformers baselines on the same target and prompts.

    python -m trtllm_dflash.perf.bench_decode [--target DIR --drafter DIR] [--dflash2-drafter DIR] [--prompts 4]
        [--prompt-len 64] [--max-new-tokens 128] [--block-size B] [--ddtree-budget N]
        [--threads 2] [--dtype float32] [--repeats 5] [--baselines [--ar-draft DIR]] [--json]
    trtllm-dflash bench decode RECIPE --json          (the same, driven by a recipe)

Prompts: when the target directory has a tokenizer, windows of the corpus's held-out files
(never in any training data), evenly spaced; otherwise random token ids.

Without --target/--drafter it builds random-weight models in memory: an 8-layer, 256-hidden
Qwen3 target (4 heads x 64, 2 KV heads, FFN 768, vocab 4096, tied) and a 2-layer drafter
(block 16). Random drafters accept almost nothing (tau ~ 1), so on random weights the spec
modes are *slower* than ar; the table still shows what a round costs and the break-even tau
(round time / ar time per token). Meaningful speed-ups need a trained pair.

Greedy decoding. In float32 every mode must produce the same tokens (an error otherwise);
in bfloat16 the verify pass and the 1-token step round differently, so near-ties may flip
and the number of prompts whose output matches ar is reported instead. tokens/s counts the
tokens after the first one over the time after the prefill. The modes are interleaved
(ar, dflash, ddtree, ar, ...) --repeats times after a warm-up, and the median repeat is
reported (the fastest is in the JSON too). tau is tokens committed per target verify pass.
Per-pass micro-timings (median of repeated calls) show the cost model: 1-token target
step, B-token verify, drafter pass. The HF baselines (perf/bench_baselines.py) report their
speed-up against HF's own greedy generate on the same prompts.

The last stdout line with --json is one JSON object: tau, ar_tok_s, dflash_tok_s, speedup,
ddtree_tau, ddtree_tok_s, ddtree_speedup, identical_to_ar, modes, passes, settings,
prompts, with a DFlash2 drafter dflash2_tau, dflash2_tok_s, dflash2_speedup (its block size
is its own unless --block-size is given) and, with --baselines, baselines {hf_ar_tok_s,
hf_assisted_tok_s, hf_assisted_speedup, hf_prompt_lookup_tok_s, hf_prompt_lookup_speedup, ...}.
"""

from __future__ import annotations

import argparse
import builtins
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.sources import heldout_token_prompts
from trtllm_dflash.reference import (
    DFlashDraft,
    DraftConfig,
    Target,
    TargetConfig,
    generate_steps,
    load_drafter,
    load_pair,
)
from trtllm_dflash.reference.rope import RopeConfig


def random_pair(seed: int = 0, dtype=torch.float32) -> tuple[Target, DFlashDraft]:
    rope = RopeConfig(10000.0)
    tcfg = TargetConfig(
        arch="qwen3", vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=8, num_heads=4,
        num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6, rope=rope, max_position_embeddings=4096,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, qk_norm=True, eos_token_ids=(),
    )
    dcfg = DraftConfig(
        hidden_size=256, intermediate_size=768, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
        rms_norm_eps=1e-6, rope=rope, max_position_embeddings=4096, block_size=16, target_layer_ids=(1, 4, 6),
        mask_token_id=1, num_target_layers=8, vocab_size=4096,
    )
    torch.manual_seed(seed)
    models = Target(tcfg), DFlashDraft(dcfg)
    with torch.no_grad():
        for m in models:
            for name, p in m.named_parameters():
                p.normal_(0, 0.05) if not name.endswith("norm.weight") else p.fill_(1.0)
    return tuple(m.to(dtype).eval() for m in models)


def sibling_dflash2(drafter_dir) -> Path | None:
    """DRAFTER/../drafter-dflash2 when it holds a drafter (the shipped pair's DFlash2 drafter)."""
    if drafter_dir is None:
        return None
    d = Path(drafter_dir).parent / "drafter-dflash2"
    return d if (d / "config.json").is_file() else None


def decode(target, drafter, prompts, n, mode, block_size, budget) -> dict:
    """Run one mode; decode time excludes the prefill (and its first token)."""
    tokens = [[] for _ in prompts]
    rounds: list[int] = []
    t_draft = t_verify = 0.0
    t_start = None
    for rec in generate_steps(target, drafter, prompts, n, mode=mode, block_size=block_size,
                              ddtree_budget=budget, stop_token_ids=[]):
        if rec.round == 0:
            t_start = time.perf_counter()
        else:
            rounds += [len(t) for t in rec.tokens]
            t_draft += rec.t_draft
            t_verify += rec.t_verify
        for r, t in zip(rec.seq_ids, rec.tokens):
            tokens[r] += t
    wall = time.perf_counter() - t_start
    n_rounds = len(rounds) / len(prompts)
    return {
        "mode": mode,
        "tokens": tokens,
        "tokens_per_s": sum(len(t) - 1 for t in tokens) / wall,
        "tau": sum(rounds) / len(rounds),
        "rounds": n_rounds,
        "ms_per_round": 1e3 * wall / n_rounds,
        "draft_ms_per_round": 1e3 * t_draft / n_rounds,
        "verify_ms_per_round": 1e3 * t_verify / n_rounds,
        "overhead_ms_per_round": 1e3 * (wall - t_draft - t_verify) / n_rounds,
    }


def _same(a: list, b: list) -> int:
    """How many of the prompts' token lists are identical in a and b."""
    return sum(x == y for x, y in zip(a, b))


def _median_ms(fn, reps: int = 30) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def micro(target: Target, drafters: dict[str, DFlashDraft], context: int, block: int) -> dict:
    """Median ms of: a 1-token target step, a `block`-token verify (with feature capture),
    and per drafter ({"draft": ..., "dflash2_draft": ...}) a pass (block slots, 4 new context
    positions) plus the LM head on its slots (and DFlash2's selector)."""
    cache = target.new_cache(1, context + block + 8)
    ids = torch.randint(0, target.cfg.vocab_size, (1, context + block), device=target.device)
    pos = torch.arange(context + block, device=target.device)[None]
    capture = tuple(sorted({i for d in drafters.values() for i in d.target_layer_ids}))
    _, feats = target(ids[:, :context], pos[:, :context], cache, context,
                      torch.ones(context, context, dtype=torch.bool).tril()[None, None], capture)
    def one():
        return target(ids[:, context : context + 1], pos[:, context : context + 1], cache, context + 1, None)
    mask = (pos[0, : context + block][None, :] <= pos[0, context : context + block][:, None])[None, None]
    def verify():
        return target(ids[:, context:], pos[:, context:], cache, context + block, mask, capture)
    out = {"target_step_ms": _median_ms(one), f"verify_{block}_ms": _median_ms(verify)}
    start, H = torch.tensor([context], device=target.device), target.cfg.hidden_size
    for name, d in drafters.items():
        own = torch.cat([feats[..., capture.index(i) * H : (capture.index(i) + 1) * H] for i in d.target_layer_ids], -1)
        dcache = d.new_cache(1, context + block + 8)
        noise = target.embed_tokens(torch.full((1, block), d.mask_token_id, device=target.device))
        new_ctx, new_pos = own[:, -4:], pos[:, context - 4 : context]
        d(noise, start, own[:, :-4], pos[:, : context - 4], dcache)

        def draft(d=d, dcache=dcache, noise=noise, new_ctx=new_ctx, new_pos=new_pos):
            hidden = d(noise, start, new_ctx, new_pos, dcache)[:, 1:]
            logits = d.logits(hidden, target.lm_head)
            if d.candidate_selector is not None:  # DFlash2: the selector's path is part of its draft
                d.candidate_selector.select(hidden, logits, noise.new_zeros(1, dtype=torch.long))

        out[f"{name}_pass_ms"] = _median_ms(draft)
    return out


def run_modes(target, drafter, prompts, n, block, budget, batch, repeats, dflash2=None, block2=None) -> list[dict]:
    """ar, dflash, ddtree (and dflash2: the DFlash2 drafter `dflash2` in dflash mode, block
    `block2`) interleaved `repeats` times. tokens_per_s is the median over the repeats of
    (all tokens / all time), tokens_per_s_best the fastest repeat."""
    batches = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    runs = {"ar": (drafter, "ar", block), "dflash": (drafter, "dflash", block), "ddtree": (drafter, "ddtree", block)}
    if dflash2 is not None:
        runs["dflash2"] = (dflash2, "dflash", block2)
        decode(target, dflash2, batches[0], 8, "dflash", block2, budget)  # warm-up
    decode(target, drafter, batches[0], 8, "dflash", block, budget)  # warm-up
    modes = tuple(runs)
    reps: dict[str, list[list[dict]]] = {m: [] for m in modes}
    for _ in range(repeats):
        for mode, (d, how, blk) in runs.items():
            reps[mode].append([decode(target, d, b, n, how, blk, budget) for b in batches])
    results = []
    for mode in modes:
        per_rep = []
        for runs in reps[mode]:
            count = sum(len(t) - 1 for r in runs for t in r["tokens"])
            per_rep.append(count / sum(sum(len(t) - 1 for t in r["tokens"]) / r["tokens_per_s"] for r in runs))
        runs = reps[mode][per_rep.index(statistics.median_low(per_rep))]
        res = {k: statistics.fmean(r[k] for r in runs) for k in runs[0] if k not in ("mode", "tokens", "tokens_per_s")}
        committed = sum(r["tau"] * r["rounds"] * len(r["tokens"]) for r in runs)
        # tokens per verify pass, all prompts
        res["tau"] = committed / sum(r["rounds"] * len(r["tokens"]) for r in runs)
        res["tokens_per_s"] = statistics.median(per_rep)
        res["tokens_per_s_best"] = max(per_rep)
        res["tokens_per_s_runs"] = per_rep
        results.append({"mode": mode, **res, "tokens": [t for r in runs for t in r["tokens"]]})
    return results


def bench(target_dir=None, drafter_dir=None, *, prompts=4, prompt_len=64, max_new_tokens=128, block_size=None,
          ddtree_budget=None, batch=1, repeats=5, dtype="float32", seed=0, baselines=False, ar_draft=None,
          assistant_tokens=5, lookup_tokens=10, lookup_ngram=2, dflash2_dir=None) -> dict:
    """Run the benchmark; returns the JSON-able result (see main for the fields). dflash2_dir: a
    DFlash2 drafter of the same target, run as a fourth mode."""
    dt = getattr(torch, dtype)
    dflash2 = None
    if target_dir or drafter_dir:
        target, drafter = load_pair(target_dir, drafter_dir, dt)
        source = f"{target_dir} + {drafter_dir}"
        if dflash2_dir:
            dflash2 = load_drafter(dflash2_dir, target, dt)
            if not dflash2.cfg.dflash2:
                raise UserError(f"drafter {dflash2_dir}/config.json: not a DFlash2 drafter (no "
                                "dflash_config.conv_kernel_size)")
            source += f" (+ DFlash2 {dflash2_dir})"
    else:
        target, drafter = random_pair(seed, dt)
        source = "random weights: Qwen3 8L x 256 (vocab 4096) + 2-layer drafter"
    block = block_size or drafter.block_size
    block2 = None if dflash2 is None else block_size or dflash2.block_size
    if dflash2 is not None and block2 > dflash2.block_size:
        raise UserError(f"block size {block2} exceeds the DFlash2 drafter's block_size {dflash2.block_size}")
    budget = ddtree_budget or block - 1
    ps = heldout_token_prompts(target_dir, prompts, prompt_len) if target_dir else None
    prompt_source = ("the shipped held-out Python text (prompts/data)" if ps is not None
                     else "random token ids (no tokenizer)")
    if ps is None:
        g = torch.Generator().manual_seed(seed)
        ps = [torch.randint(0, target.cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    results = run_modes(target, drafter, ps, max_new_tokens, block, budget, batch, repeats, dflash2, block2)
    ar = results[0]
    for r in results:
        r["same_as_ar"] = sum(a == b for a, b in zip(r["tokens"], ar["tokens"]))
    if dt == torch.float32 and any(r["same_as_ar"] != len(ps) for r in results):
        raise SystemExit("error: the modes produced different greedy outputs in float32")
    ar_ms_per_token = 1e3 / ar["tokens_per_s"] * batch
    for r in results:
        r["ratio_vs_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
        r["break_even_tau"] = r["ms_per_round"] / ar_ms_per_token
    mic = micro(target, {"draft": drafter, **({"dflash2_draft": dflash2} if dflash2 is not None else {})},
                prompt_len + max_new_tokens // 2, block)
    by = {r["mode"]: r for r in results}
    out = {
        "source": source,
        "prompts": {"count": len(ps), "prompt_len": prompt_len, "from": prompt_source},
        "settings": {"max_new_tokens": max_new_tokens, "block_size": block, "ddtree_budget": budget, "batch": batch,
                     "repeats": repeats, "dtype": dtype, "threads": torch.get_num_threads(), "greedy": True},
        "tau": by["dflash"]["tau"],
        "ar_tok_s": ar["tokens_per_s"],
        "dflash_tok_s": by["dflash"]["tokens_per_s"],
        "speedup": by["dflash"]["ratio_vs_ar"],
        "ddtree_tau": by["ddtree"]["tau"],
        "ddtree_tok_s": by["ddtree"]["tokens_per_s"],
        "ddtree_speedup": by["ddtree"]["ratio_vs_ar"],
        **({"dflash2_tau": by["dflash2"]["tau"], "dflash2_tok_s": by["dflash2"]["tokens_per_s"],
            "dflash2_speedup": by["dflash2"]["ratio_vs_ar"], "dflash2_block_size": block2} if dflash2 is not None
            else {}),
        "identical_to_ar": {r["mode"]: f"{r['same_as_ar']}/{len(ps)}" for r in results},
        "modes": [{k: v for k, v in r.items() if k != "tokens"} for r in results],
        "passes": mic,
    }
    if baselines:
        from trtllm_dflash.perf.bench_baselines import run_baselines

        if target_dir is None:
            raise SystemExit("error: the HF baselines need a target directory (--target)")
        hf = run_baselines(Path(target_dir), ps, max_new_tokens, repeats, ar_draft, assistant_tokens,
                           lookup_tokens, lookup_ngram)
        base = {"notes": hf.pop("notes"), "hf_ar_tok_s": hf["hf_ar"]["tok_s"],
                "hf_ar_identical_to_ar": f"{_same(hf['hf_ar']['tokens'], ar['tokens'])}/{len(ps)}"}
        for m, r in hf.items():
            if m == "hf_ar":
                continue
            base[f"{m}_tok_s"] = r["tok_s"]
            base[f"{m}_speedup"] = r["tok_s"] / hf["hf_ar"]["tok_s"]
            base[f"{m}_identical_to_hf_ar"] = f"{_same(r['tokens'], hf['hf_ar']['tokens'])}/{len(ps)}"
        base["tok_s_runs"] = {m: r["tok_s_runs"] for m, r in hf.items()}
        out["baselines"] = base
    return out


def print_report(res: dict, file=None) -> None:
    print = functools.partial(builtins.print, file=file or sys.stdout)
    s, pr = res["settings"], res["prompts"]
    print(f"{res['source']}; {pr['count']} prompts x {pr['prompt_len']} tokens ({pr['from']}), {s['max_new_tokens']} "
          f"new, batch {s['batch']}, block {s['block_size']}, ddtree budget {s['ddtree_budget']}, {s['dtype']}, "
          f"{s['threads']} threads, greedy, median of {s['repeats']} interleaved runs")
    print(f"{'mode':18} {'tok/s':>8} {'speed-up':>9} {'tau':>6} {'ms/round':>9} {'draft':>7} {'verify':>7} "
          f"{'other':>7} {'break-even tau':>15} {'identical':>10}")
    for r in res["modes"]:
        print(f"{r['mode']:18} {r['tokens_per_s']:8.1f} {r['ratio_vs_ar']:9.2f} {r['tau']:6.2f} "
              f"{r['ms_per_round']:9.2f} {r['draft_ms_per_round']:7.2f} {r['verify_ms_per_round']:7.2f} "
              f"{r['overhead_ms_per_round']:7.2f} {r['break_even_tau']:15.2f} {res['identical_to_ar'][r['mode']]:>10}")
    b = res.get("baselines")
    if b:
        print(f"{'hf_ar':18} {b['hf_ar_tok_s']:8.1f} {1.0:9.2f} {'':6} (HF model; its greedy output equals ar on "
              f"{b['hf_ar_identical_to_ar']} prompts)")
        for m in ("hf_assisted", "hf_prompt_lookup"):
            if f"{m}_tok_s" in b:
                print(f"{m:18} {b[m + '_tok_s']:8.1f} {b[m + '_speedup']:9.2f} {'':6} (vs hf_ar; identical to hf_ar "
                      f"{b[m + '_identical_to_hf_ar']}; {b['notes'][m]})")
            else:
                print(f"{m:18} {b['notes'][m]}")
    mic = res["passes"]
    print("passes (median ms): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in mic.items())
          + f"; draft/step {mic['draft_pass_ms'] / mic['target_step_ms']:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="HF target directory (default: random 8x256 Qwen3)")
    p.add_argument("--drafter", help="z-lab drafter directory (default: random 2-layer drafter)")
    p.add_argument("--dflash2-drafter", help="a DFlash2 drafter of the same target: a fourth mode, dflash2 "
                   "(default: DRAFTER/../drafter-dflash2 when it exists, as in the shipped pair)")
    p.add_argument("--prompts", type=int, default=4, help="prompts, decoded one at a time (batch 1)")
    p.add_argument("--batch", type=int, default=1, help="decode the prompts in batches of this size")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    p.add_argument("--ddtree-budget", type=int, default=None, help="default: block size - 1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--repeats", type=int, default=5, help="interleaved runs per mode; the median is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baselines", action="store_true", help="also run the HF baselines (assisted, prompt lookup)")
    p.add_argument("--ar-draft", help="HF AR draft model for assisted generation (default: DRAFTER/../ar-draft)")
    p.add_argument("--assistant-tokens", type=int, default=5, help="draft tokens per round of assisted generation")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--lookup-ngram", type=int, default=2, help="max_matching_ngram_size")
    p.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    ar_draft = args.ar_draft or (Path(args.drafter).parent / "ar-draft" if args.drafter else None)
    res = bench(args.target, args.drafter, prompts=args.prompts, prompt_len=args.prompt_len,
                max_new_tokens=args.max_new_tokens, block_size=args.block_size, ddtree_budget=args.ddtree_budget,
                batch=args.batch, repeats=args.repeats, dtype=args.dtype, seed=args.seed, baselines=args.baselines,
                ar_draft=ar_draft, assistant_tokens=args.assistant_tokens, lookup_tokens=args.lookup_tokens,
                lookup_ngram=args.lookup_ngram, dflash2_dir=args.dflash2_drafter or sibling_dflash2(args.drafter))
    print_report(res)
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
