"""Drafter training data: the target's own greedy continuations ("target alignment").

For each sequence: a prompt of `prompt_len` tokens at a random offset in the TRAIN split
(windows that contain `<|endoftext|>` are redrawn, so a prompt never spans two files),
then `gen_len` tokens of the target's greedy output, decoded in batches with a KV cache in
fp32 (the precision the reference backend verifies in, so the drafter learns exactly the
tokens it will be checked against).

Output directory (each file written to a temporary name and renamed):
- `continuations.safetensors`
    input_ids  int64 [N, prompt_len + gen_len]  prompt then greedy continuation
    loss_mask  uint8 [N, prompt_len + gen_len]  1 on generated tokens up to and including
                                                 the first eos, 0 on the prompt and after it
- `heldout_prompts.safetensors` (evaluation; prompts from the HELD-OUT files)
    prompt_ids int64 [M, eval_prompt_len]        evenly spaced, non-overlapping windows without eos
    greedy_ids int64 [M, eval_gen_len]           the target's fp32 greedy continuation
- `meta.json`: lengths, counts, seeds, dtype, the target's weight checksum, corpus info.

    python -m trtllm_dflash.train.data --target TARGET_DIR --out DATA_DIR --num-seqs 10240
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.sources import sample_eval_prompts, sample_train_prompts

FORMAT_VERSION = 1


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, gen_len: int, batch_size: int = 128, on_batch=None) -> torch.Tensor:
    """Greedy continuation of equal-length prompts with a KV cache.  # [N, gen_len]

    The model runs in its own dtype; prompts need no padding because they all have the
    same length."""
    from transformers import DynamicCache

    model.eval()
    outs = []
    for i in range(0, prompts.shape[0], batch_size):
        x = prompts[i : i + batch_size]  # [b, P]
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits[:, -1]  # [b, V]
        gen = torch.empty(x.shape[0], gen_len, dtype=torch.long)
        for t in range(gen_len):
            nxt = logits.argmax(dim=-1)  # [b]
            gen[:, t] = nxt
            if t + 1 < gen_len:
                logits = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
        outs.append(gen)
        if on_batch is not None:
            on_batch(x.shape[0])
    return torch.cat(outs)


def generated_loss_mask(generated: torch.Tensor, prompt_len: int, eos_id: int) -> torch.Tensor:
    """uint8 [N, prompt_len + G]: 1 on generated tokens up to and including the first eos."""
    is_eos = (generated == eos_id).long()  # [N, G]
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # eos tokens strictly before t
    gen_mask = (eos_before == 0).to(torch.uint8)
    return torch.cat([torch.zeros(generated.shape[0], prompt_len, dtype=torch.uint8), gen_mask], dim=1)


def _save_atomic(tensors: dict, path: Path, metadata: dict) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
              metadata={k: str(v) for k, v in metadata.items()})
    os.replace(tmp, path)


def load_continuations(data_dir: str | Path) -> dict:
    """{'input_ids', 'loss_mask', 'prompt_ids', 'greedy_ids', 'meta'} from a data directory."""
    from safetensors.torch import load_file

    data_dir = Path(data_dir)
    for name in ("continuations.safetensors", "heldout_prompts.safetensors", "meta.json"):
        if not (data_dir / name).is_file():
            raise UserError(f"{data_dir} has no {name}; generate it with `python -m trtllm_dflash.train.data`")
    meta = json.loads((data_dir / "meta.json").read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{data_dir / 'meta.json'}: format_version {meta.get('format_version')!r}, expected "
                        f"{FORMAT_VERSION}")
    out = load_file(str(data_dir / "continuations.safetensors"))
    out.update(load_file(str(data_dir / "heldout_prompts.safetensors")))
    out["meta"] = meta
    return out


def generate_data(
    model,
    train_tokens: torch.Tensor,
    heldout_tokens: torch.Tensor,
    out_dir: Path,
    *,
    eos_token_id: int,
    mask_token_id: int | None,
    num_seqs: int,
    prompt_len: int = 64,
    gen_len: int = 192,
    batch_size: int = 128,
    seed: int = 1234,
    eval_prompts: int = 32,
    eval_prompt_len: int = 96,
    eval_gen_len: int = 128,
    extra_meta: dict | None = None,
) -> dict:
    """Sample prompts, decode greedily with `model` (in its own dtype) and write the three
    files of the module docstring into `out_dir`. Returns the metadata."""
    import rich.progress as rp

    for name, v in (("num_seqs", num_seqs), ("prompt_len", prompt_len), ("gen_len", gen_len),
                    ("batch_size", batch_size),
                    ("eval_prompts", eval_prompts), ("eval_prompt_len", eval_prompt_len),
                    ("eval_gen_len", eval_gen_len)):
        if v < 1:
            raise UserError(f"--{name.replace('_', '-')}={v} must be >= 1")
    n_pos = model.config.max_position_embeddings
    for p, g, what in ((prompt_len, gen_len, ""), (eval_prompt_len, eval_gen_len, "eval-")):
        if p + g > n_pos:
            raise UserError(f"--{what}prompt-len + --{what}gen-len = {p + g} exceeds the target's "
                            f"max_position_embeddings {n_pos}")
    prompts = sample_train_prompts(train_tokens, num_seqs, prompt_len, seed, eos_token_id)  # [N, P]
    held_prompts = sample_eval_prompts(heldout_tokens, eval_prompts, eval_prompt_len, eos_token_id)  # [M, P_eval]

    t0 = time.perf_counter()
    with rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                     rp.TimeElapsedColumn(), rp.TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task("held-out greedy", total=eval_prompts)
        held_greedy = greedy_continue(model, held_prompts, eval_gen_len, batch_size,
                                      on_batch=lambda n: bar.advance(task, n))  # [M, G_eval]
        task = bar.add_task("continuations", total=num_seqs)
        last = [time.perf_counter()]

        def tick(n):
            bar.advance(task, n)
            if not bar.console.is_terminal:  # a log file gets one line per batch
                print(f"continuations {int(bar.tasks[task].completed)}/{num_seqs} "
                      f"({time.perf_counter() - last[0]:.1f}s for {n})", file=sys.stderr, flush=True)
            last[0] = time.perf_counter()

        generated = greedy_continue(model, prompts, gen_len, batch_size, on_batch=tick)  # [N, G]
    seconds = time.perf_counter() - t0

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "num_seqs": num_seqs,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "seed": seed,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "eos_token_id": eos_token_id,
        "mask_token_id": mask_token_id,
        "eval_prompts": eval_prompts,
        "eval_prompt_len": eval_prompt_len,
        "eval_gen_len": eval_gen_len,
        "generation_seconds": round(seconds, 1),
        "torch": torch.__version__,
        **(extra_meta or {}),
    }
    input_ids = torch.cat([prompts, generated], dim=1)  # [N, P+G]
    _save_atomic({"input_ids": input_ids, "loss_mask": generated_loss_mask(generated, prompt_len, eos_token_id)},
                 out_dir / "continuations.safetensors", meta)
    _save_atomic({"prompt_ids": held_prompts, "greedy_ids": held_greedy}, out_dir / "heldout_prompts.safetensors", meta)
    tmp = out_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, out_dir / "meta.json")
    return meta


def main(argv: list[str] | None = None) -> int:
    from trtllm_dflash.prompts.corpus import load_corpus
    from trtllm_dflash.prompts.sources import encode_files
    from trtllm_dflash.train.target import load_target
    from trtllm_dflash.train.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description="Generate the drafter's training data: target greedy continuations.")
    ap.add_argument("--target", type=Path, required=True, help="target model directory (with tokenizer)")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--num-seqs", type=int, default=10240, help="training continuations")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--eval-prompt-len", type=int, default=96)
    ap.add_argument("--eval-gen-len", type=int, default=128)
    ap.add_argument("--heldout-fraction", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    tok = load_tokenizer(args.target)
    model = load_target(args.target, torch.float32)
    weights = args.target / "model.safetensors"
    corpus = load_corpus(heldout_fraction=args.heldout_fraction)
    train_tokens = torch.tensor(encode_files(tok, [f.text for f in corpus.train]), dtype=torch.long)
    heldout_tokens = torch.tensor(encode_files(tok, [f.text for f in corpus.heldout]), dtype=torch.long)
    meta = generate_data(
        model, train_tokens, heldout_tokens, args.out,
        eos_token_id=tok.eos_token_id, mask_token_id=tok.mask_token_id, num_seqs=args.num_seqs,
        prompt_len=args.prompt_len, gen_len=args.gen_len, batch_size=args.batch_size, seed=args.seed,
        eval_prompts=args.eval_prompts, eval_prompt_len=args.eval_prompt_len, eval_gen_len=args.eval_gen_len,
        extra_meta={
            "target_weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None,
            "corpus_python": corpus.info.python_full_version,
            "corpus_fingerprint": corpus.info.fingerprint,
            "heldout_fraction": args.heldout_fraction,
        },
    )
    print(f"{args.num_seqs} continuations + {args.eval_prompts} held-out prompts in {meta['generation_seconds']:.0f}s "
          f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
