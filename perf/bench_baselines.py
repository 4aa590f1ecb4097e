"""Baselines users would try instead of DFlash, on the same target and prompts, in HF transformers:

  hf_ar            `model.generate`, greedy, KV cache: the reference for the two below
  hf_assisted      assisted generation with a small autoregressive draft model
                   (`generate(assistant_model=...)`; see trtllm_dflash/train/ar_draft.py)
  hf_prompt_lookup prompt-lookup decoding (`generate(prompt_lookup_num_tokens=...)`):
                   drafts copied from the prompt/output n-grams, no draft model

These run the HF model, while our modes run the lean reference target, so each baseline's
speed-up is against hf_ar (its own AR), and ours against the reference ar.

Timing matches perf/bench_decode.py: tokens after the first over the time after the first
token (a streamer marks it), batch 1, greedy, no stop token (every run makes exactly the
requested number of tokens). Methods are interleaved, `repeats` times; medians are reported.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from trtllm_dflash import compat

METHODS = ("hf_ar", "hf_assisted", "hf_prompt_lookup")


class _FirstTokenClock:
    """A generate() streamer that only notes when the first new token arrives."""

    def __init__(self):
        self.calls, self.t_first = 0, None

    def put(self, value) -> None:
        self.calls += 1  # call 1 is the prompt, call 2 the first generated token
        if self.calls == 2:
            self.t_first = time.perf_counter()

    def end(self) -> None:
        pass


def load_hf(directory: Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, attn_implementation="sdpa").eval()
    # fixed-length outputs, as in our modes
    model.generation_config.eos_token_id = compat.never_stopping_eos(model.config.vocab_size)
    model.generation_config.pad_token_id = 0
    return model


@torch.inference_mode()
def hf_decode(model, prompt: list[int], n: int, **kw) -> tuple[list[int], float]:
    """Greedy generate -> (new tokens, seconds after the first new token)."""
    from transformers.generation.streamers import BaseStreamer

    clock = type("Clock", (_FirstTokenClock, BaseStreamer), {})()
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, streamer=clock, **kw)
    t_end = time.perf_counter()
    return out[0, len(prompt) :].tolist(), t_end - clock.t_first


def run_baselines(
    target_dir: Path,
    prompts: list[list[int]],
    n: int,
    repeats: int,
    ar_draft_dir: Path | None = None,
    assistant_tokens: int = 5,
    lookup_tokens: int = 10,
    lookup_ngram: int = 2,
) -> dict:
    """{method: {"tok_s", "tok_s_runs", "tokens"}} plus the settings used. hf_assisted is
    skipped (with the reason) when no draft model is given."""
    target = load_hf(target_dir)
    methods: dict[str, dict] = {"hf_ar": {}}
    notes = {}
    if ar_draft_dir is not None and Path(ar_draft_dir, "config.json").is_file():
        draft = load_hf(ar_draft_dir)
        # A fixed draft length (the "constant" schedule, no confidence cut-off) keeps runs comparable.
        draft.generation_config.num_assistant_tokens = assistant_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        methods["hf_assisted"] = {"assistant_model": draft}
        notes["hf_assisted"] = (f"AR draft {Path(ar_draft_dir).name}: {draft.config.num_hidden_layers} layers, "
                                f"{sum(p.numel() for p in draft.parameters()):,} params, {assistant_tokens} tokens per "
                                "round")
    else:
        notes["hf_assisted"] = f"skipped: no AR draft model at {ar_draft_dir}"
    methods["hf_prompt_lookup"] = {"prompt_lookup_num_tokens": lookup_tokens, "max_matching_ngram_size": lookup_ngram}
    notes["hf_prompt_lookup"] = f"prompt_lookup_num_tokens={lookup_tokens}, max_matching_ngram_size={lookup_ngram}"
    for name, kw in methods.items():  # warm-up
        hf_decode(target, prompts[0], 8, **kw)
    runs: dict[str, list[float]] = {m: [] for m in methods}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for name, kw in methods.items():
            toks, secs = zip(*(hf_decode(target, p, n, **kw) for p in prompts))
            runs[name].append(sum(len(t) - 1 for t in toks) / sum(secs))
            tokens[name] = list(toks)
    out = {m: {"tok_s": statistics.median(runs[m]), "tok_s_runs": runs[m], "tokens": tokens[m]} for m in methods}
    out["notes"] = notes
    return out
