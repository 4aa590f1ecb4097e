"""Train the tiny TARGET model: a Hugging Face `Qwen3ForCausalLM` on the stdlib corpus.

A real HF architecture, so every backend path (reference, conversion, engines) can load
it. Training runs on CPU: bf16 autocast (fp32 master weights), AdamW, linear warm-up then
cosine decay to `min_lr`, gradient clipping, a periodic held-out loss, checkpoints and
exact resume. The shipped copy is bf16 safetensors.

Data: the token stream of the train split (files joined by `<|endoftext|>`); each step
draws `batch_size` windows of `seq_len + 1` tokens at uniform random offsets from a
seeded generator whose state is checkpointed, so a resumed run draws the same batches as
an uninterrupted one.

    python -m trtllm_dflash.train.target --tokenizer TOK_DIR --out OUT_DIR [--resume]

Checkpoints go to `--ckpt-dir` (default `OUT_DIR.ckpt`); the final model is written to a
temporary directory next to OUT_DIR and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from trtllm_dflash.errors import UserError
from trtllm_dflash.train.common import adamw_decay_groups, atomic_dir, check_resume, load_checkpoint, optimizer_step

# isort: split
from trtllm_dflash.train.common import progress_bar, restore, save_checkpoint


# Alike only in form to train/drafter_config.py's DrafterTrainConfig (a model shape vs training settings): not merged.
@dataclass(frozen=True)
class TargetModelConfig:
    """Shape of the tiny Qwen3 target."""

    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 12
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def to_hf(self, eos_token_id: int = 0):
        from transformers import Qwen3Config

        cfg = Qwen3Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=True,
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
        )
        # transformers 5 stores RoPE under `rope_parameters`; 4.x readers (e.g. the
        # TensorRT-LLM 1.2 containers) look for the top-level key, so write both.
        cfg.rope_theta = self.rope_theta
        cfg.architectures = ["Qwen3ForCausalLM"]
        cfg._attn_implementation = "sdpa"
        return cfg


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 1000
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    bf16: bool = True  # bf16 autocast on CPU; master weights stay fp32
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 128  # held-out windows per periodic eval (evenly spaced)
    ckpt_every: int = 50
    log_every: int = 25


# Fields that may change between a run and its resume without changing the result.
_RESUME_FREE = {"eval_every", "eval_windows", "ckpt_every", "log_every"}


def _windows(tokens: torch.Tensor, seq_len: int, max_windows: int | None) -> torch.Tensor:
    """Non-overlapping windows of seq_len + 1 tokens, evenly spaced if capped.  # [N, S+1]"""
    n = (tokens.numel() - 1) // seq_len
    if n < 1:
        raise UserError(f"evaluation stream has {tokens.numel()} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.arange(n) * seq_len
    if max_windows is not None and n > max_windows:
        starts = starts[torch.linspace(0, n - 1, max_windows).round().long()]
    return torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()])


def lm_loss(model, batch: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean next-token cross-entropy of a [B, S+1] batch (fp32 loss)."""
    x, y = batch[:, :-1], batch[:, 1:]  # [B, S]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=x, use_cache=False).logits  # [B, S, V]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, bf16: bool, batch_size: int = 8) -> float:
    """Token-weighted mean loss over [N, S+1] windows."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, windows.shape[0], batch_size):
        b = windows[i : i + batch_size]
        total += lm_loss(model, b, bf16).item() * b.shape[0]
    model.train(was_training)
    return total / windows.shape[0]


def build_model(model_cfg: TargetModelConfig, seed: int, eos_token_id: int = 0):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(model_cfg.to_hf(eos_token_id))


def _lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:  # multiplier on cfg.lr for optimizer step `step` (0-based)
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
        floor = cfg.min_lr / cfg.lr
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def _make_optimizer(model, cfg: TrainConfig):
    opt = adamw_decay_groups(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    return opt, sched


def _check_resume_config(saved: dict, model_cfg: TargetModelConfig, cfg: TrainConfig, path: Path) -> None:
    check_resume(saved["model_config"], asdict(model_cfg), path, "model config field")
    check_resume(saved["train_config"], asdict(cfg), path, "train config field", free=_RESUME_FREE)


@dataclass
class TrainResult:
    model: object  # the trained Qwen3ForCausalLM (fp32)
    step: int  # optimizer steps done
    losses: dict  # step (1-based) -> training loss of that step, this process only
    history: list  # [{"step", "loss", "lr", "heldout_loss"?, "elapsed"}], all processes
    elapsed: float  # training seconds, all processes


def train(
    model_cfg: TargetModelConfig,
    cfg: TrainConfig,
    train_tokens: torch.Tensor,
    heldout_tokens: torch.Tensor,
    ckpt_dir: Path,
    resume: bool = False,
    stop_after: int | None = None,
    eos_token_id: int = 0,
    progress: bool = True,
    log: bool = True,
) -> TrainResult:
    """Train (or resume) and return the fp32 model. `stop_after` ends after that many steps
    in total, saving a checkpoint first (an interruption that can be resumed). `progress`
    shows a live bar (only on a terminal); `log` prints a line every `log_every` steps."""
    if train_tokens.numel() <= cfg.seq_len + 1:
        raise UserError(f"train split has {train_tokens.numel()} tokens, need more than seq_len + 1 = "
                        f"{cfg.seq_len + 1}")
    if int(train_tokens.max()) >= model_cfg.vocab_size:
        raise UserError(f"token id {int(train_tokens.max())} >= vocab_size {model_cfg.vocab_size}")
    ckpt_dir = Path(ckpt_dir)
    ckpt_path = ckpt_dir / "last.pt"
    model = build_model(model_cfg, cfg.seed, eos_token_id)
    model.train()
    opt, sched = _make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, history, elapsed_before, ema = 0, [], 0.0, None
    resumable = {"model": model, "optimizer": opt, "scheduler": sched, "data_rng": gen}  # saved and restored by name
    if resume:
        state = load_checkpoint(ckpt_path)
        _check_resume_config(state, model_cfg, cfg, ckpt_path)
        restore(state, resumable)
        torch.set_rng_state(state["torch_rng"])
        step, history, elapsed_before = state["step"], state["history"], state["elapsed"]
        ema = state.get("loss_ema")

    def save_ckpt():
        save_checkpoint(
            ckpt_path,
            resumable,
            torch_rng=torch.get_rng_state(),
            step=step,
            history=history,
            elapsed=elapsed_before + (time.perf_counter() - t_start),
            loss_ema=ema,
            model_config=asdict(model_cfg),
            train_config=asdict(cfg),
        )

    eval_windows = _windows(heldout_tokens, cfg.seq_len, cfg.eval_windows)
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    hi = train_tokens.numel() - (cfg.seq_len + 1)
    offsets_base = torch.arange(cfg.seq_len + 1)
    losses: dict[int, float] = {}
    t_start = time.perf_counter()

    bar = progress_bar("target", "loss {task.fields[loss]:.3f} lr {task.fields[lr]:.2e} {task.fields[tps]:.0f} tok/s",
                       progress)
    console = bar.console
    with bar:
        task = bar.add_task("train", total=cfg.steps, completed=step, loss=float("nan"), lr=0.0, tps=0.0)
        while step < end:
            t0 = time.perf_counter()
            starts = torch.randint(0, hi + 1, (cfg.batch_size,), generator=gen)
            batch = train_tokens[starts[:, None] + offsets_base]  # [B, S+1]
            loss = lm_loss(model, batch, cfg.bf16)
            lr = opt.param_groups[0]["lr"]
            optimizer_step(model, opt, loss, cfg.grad_clip)  # grads are None before it: zeroing first is a no-op
            sched.step()
            step += 1
            lv = loss.item()
            losses[step] = lv
            ema = lv if ema is None else 0.98 * ema + 0.02 * lv
            tps = cfg.batch_size * cfg.seq_len / (time.perf_counter() - t0)
            rec = {"step": step, "loss": round(lv, 4), "loss_ema": round(ema, 4), "lr": lr,
                   "elapsed": round(elapsed_before + time.perf_counter() - t_start, 1)}
            if step % cfg.eval_every == 0 or step == cfg.steps:
                rec["heldout_loss"] = round(evaluate(model, eval_windows, cfg.bf16), 4)
            if step % cfg.log_every == 0 or "heldout_loss" in rec:
                history.append(rec)
                if log:
                    extra = f" held-out {rec['heldout_loss']:.3f}" if "heldout_loss" in rec else ""
                    console.print(f"step {step}/{cfg.steps} loss {lv:.3f} (ema {ema:.3f}) lr {lr:.2e} "
                                  f"{tps:.0f} tok/s {rec['elapsed']:.0f}s{extra}", highlight=False)
            bar.update(task, completed=step, loss=ema, lr=lr, tps=tps)
            if step % cfg.ckpt_every == 0 or step == end:
                save_ckpt()
    return TrainResult(model, step, losses, history, elapsed_before + time.perf_counter() - t_start)


def export(model, tokenizer, out_dir: Path, dtype: torch.dtype = torch.bfloat16,
           extra_files: dict | None = None) -> None:
    """save_pretrained (safetensors) + tokenizer + generation config, written atomically."""
    import copy

    from transformers import GenerationConfig

    from trtllm_dflash.train.tokenizer import save_tokenizer

    m = copy.deepcopy(model).to(dtype).eval()
    eos = tokenizer.eos_token_id
    m.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, do_sample=False)
    with atomic_dir(out_dir) as tmp:
        m.save_pretrained(str(tmp), safe_serialization=True)
        save_tokenizer(tokenizer, tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)


def load_target(path: str | Path, dtype: torch.dtype = torch.float32):
    """Load a saved target as an eval-mode Qwen3ForCausalLM in `dtype`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json; train a target with `python -m trtllm_dflash.train.target`")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def _add_dataclass_args(ap: argparse.ArgumentParser, cls, prefix: str = "") -> None:
    for f in fields(cls):
        name = "--" + prefix + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            ap.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            typ = {"int": int, "float": float}.get(str(f.type), str)
            ap.add_argument(name, type=typ, default=f.default)


def _from_args(cls, args, prefix: str = ""):
    return cls(**{f.name: getattr(args, (prefix + f.name).replace("-", "_")) for f in fields(cls)})


def main(argv: list[str] | None = None) -> int:
    from trtllm_dflash.prompts.corpus import load_corpus
    from trtllm_dflash.prompts.sources import encode_files
    from trtllm_dflash.train.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description="Train the tiny Qwen3 target on the stdlib corpus (CPU).")
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer directory (train.tokenizer output)")
    ap.add_argument("--out", type=Path, required=True, help="final model directory (bf16 safetensors + tokenizer)")
    ap.add_argument("--ckpt-dir", type=Path, default=None, help="checkpoint directory (default: OUT.ckpt)")
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --ckpt-dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heldout-fraction", type=float, default=0.05)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this many steps")
    _add_dataclass_args(ap, TargetModelConfig, "model-")
    _add_dataclass_args(ap, TrainConfig)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    model_cfg = _from_args(TargetModelConfig, args, "model_")
    cfg = _from_args(TrainConfig, args)
    tok = load_tokenizer(args.tokenizer)
    if len(tok) != model_cfg.vocab_size:
        raise UserError(f"tokenizer {args.tokenizer} has {len(tok)} tokens but --model-vocab-size is "
                        f"{model_cfg.vocab_size}")
    corpus = load_corpus(heldout_fraction=args.heldout_fraction)
    train_tokens = torch.tensor(encode_files(tok, [f.text for f in corpus.train]), dtype=torch.long)
    heldout_tokens = torch.tensor(encode_files(tok, [f.text for f in corpus.heldout]), dtype=torch.long)
    n_params = sum(p.numel() for p in build_model(model_cfg, 0, tok.eos_token_id).parameters())
    print(f"corpus: Python {corpus.info.python_full_version}, {corpus.info.num_files} files, train "
          f"{train_tokens.numel()} tokens, held-out {heldout_tokens.numel()} tokens; model {n_params:,} params; "
          f"{cfg.steps} steps x {cfg.batch_size * cfg.seq_len} tokens", file=sys.stderr, flush=True)
    ckpt_dir = args.ckpt_dir or args.out.with_name(args.out.name + ".ckpt")
    res = train(model_cfg, cfg, train_tokens, heldout_tokens, ckpt_dir, resume=args.resume,
                stop_after=args.stop_after, eos_token_id=tok.eos_token_id, progress=not args.no_progress)
    if res.step < cfg.steps:
        print(f"stopped at step {res.step}/{cfg.steps}; checkpoint in {ckpt_dir} (rerun with --resume)",
              file=sys.stderr)
        return 0

    export(res.model, tok, args.out)
    summary_path = _write_summary(args.out, ckpt_dir, model_cfg, cfg, res, n_params, train_tokens, heldout_tokens,
                                  corpus.info)
    print(f"done: {res.step} steps in {res.elapsed:.0f}s -> {args.out}; summary {summary_path}", file=sys.stderr)
    return 0


def _write_summary(out: Path, ckpt_dir: Path, model_cfg, cfg, res, n_params: int, train_tokens, heldout_tokens,
                   corpus_info) -> Path:
    """summary.json in the checkpoint directory: the configs, the run and the final losses,
    measured on the shipped artefact (bf16 weights), computed in fp32."""
    shipped = load_target(out, torch.float32)
    heldout_loss = evaluate(shipped, _windows(heldout_tokens, cfg.seq_len, None), bf16=False)
    train_loss = evaluate(shipped, _windows(train_tokens, cfg.seq_len, 256), bf16=False)
    summary = {
        "model_config": asdict(model_cfg),
        "train_config": asdict(cfg),
        "params": n_params,
        "steps": res.step,
        "tokens_seen": res.step * cfg.batch_size * cfg.seq_len,
        "train_seconds": round(res.elapsed, 1),
        "final_train_loss_fp32_256_windows": round(train_loss, 4),
        "final_heldout_loss_fp32_all_windows": round(heldout_loss, 4),
        "train_tokens": train_tokens.numel(),
        "heldout_tokens": heldout_tokens.numel(),
        "corpus": asdict(corpus_info),
        "history": res.history,
        "torch": torch.__version__,
    }
    summary_path = ckpt_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"train loss {train_loss:.3f}, held-out loss {heldout_loss:.3f} (bf16 weights, fp32 compute)",
          file=sys.stderr)
    return summary_path


if __name__ == "__main__":
    raise SystemExit(main())
