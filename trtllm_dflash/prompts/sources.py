"""Prompt sources shared by training, benchmarks and sweeps (one place, no stage imports).

Token windows (training data, held-out evaluation prompts, benchmark prompts) come from a
token stream in which every file ends with the eos id (`encode_files`); text prompts for
sweeps come from `load_prompts` ('random' words, 'builtin:pystd-heldout' windows of the
shipped held-out Python text, or a JSONL of prompts). The built-in text is the package's
(corpus.shipped_text), never the running interpreter's stdlib: the same prompts everywhere.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.corpus import shipped_text

CHARS_PER_TOKEN = 3.5  # rough size of a prompt window; the server counts real tokens


def encode_files(tokenizer, texts: list[str]) -> list[int]:
    """Token ids of every text, each followed by the eos id (one flat list)."""
    eos = tokenizer.eos_token_id
    out: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        out.extend(ids)
        out.append(eos)
    return out


def sample_train_prompts(tokens: torch.Tensor, n: int, prompt_len: int, seed: int, eos_id: int) -> torch.Tensor:
    """`n` windows of `prompt_len` tokens at uniform random offsets, none containing eos.  # [n, P]"""
    hi = tokens.numel() - prompt_len
    if hi < 0:
        raise UserError(f"token stream of {tokens.numel()} tokens is shorter than prompt_len={prompt_len}")
    # eos_count[i] = number of eos tokens in tokens[:i]; a window [s, s+P) is clean iff the counts match.
    eos_count = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(tokens == eos_id, 0)])
    gen = torch.Generator().manual_seed(seed)
    chosen: list[torch.Tensor] = []
    have = 0
    for _ in range(1000):
        s = torch.randint(0, hi + 1, (2 * (n - have) + 16,), generator=gen)
        s = s[eos_count[s + prompt_len] == eos_count[s]][: n - have]
        chosen.append(s)
        have += s.numel()
        if have == n:
            break
    else:
        raise UserError(f"could not find {n} eos-free windows of {prompt_len} tokens; use a shorter --prompt-len")
    starts = torch.cat(chosen)
    return tokens[starts[:, None] + torch.arange(prompt_len)]


def _clean_starts(tokens: torch.Tensor, prompt_len: int, eos_id: int) -> torch.Tensor:
    """All s such that tokens[s : s + prompt_len] contains no eos, ascending."""
    # eos_count[i] = number of eos tokens in tokens[:i]; a window is clean iff the counts match.
    eos_count = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(tokens == eos_id, 0)])
    s = torch.arange(max(0, tokens.numel() - prompt_len + 1))
    return s[eos_count[s + prompt_len] == eos_count[s]]


def sample_eval_prompts(tokens: torch.Tensor, n: int, prompt_len: int, eos_id: int) -> torch.Tensor:
    """`n` eos-free, non-overlapping windows, evenly spaced over all eos-free windows.  # [n, P]"""
    starts = _clean_starts(tokens, prompt_len, eos_id)
    # Indices at least prompt_len apart in the ascending list are at least prompt_len apart
    # in the stream, so evenly spaced picks do not overlap.
    if starts.numel() == 0 or (n > 1 and (starts.numel() - 1) // (n - 1) < prompt_len):
        raise UserError(f"held-out stream of {tokens.numel()} tokens has room for only "
                        f"{0 if starts.numel() == 0 else 1 + (starts.numel() - 1) // prompt_len} of {n} "
                        f"non-overlapping eos-free prompts of {prompt_len} tokens; ask for fewer or shorter prompts")
    step = (starts.numel() - 1) // max(1, n - 1)
    picked = starts[torch.arange(n) * step]
    return tokens[picked[:, None] + torch.arange(prompt_len)]


def heldout_token_prompts(target_dir: Path, n: int, prompt_len: int) -> list[list[int]] | None:
    """`n` prompts of `prompt_len` tokens from the shipped held-out text (never trained on),
    evenly spaced, without an end-of-file inside, tokenized with the target's tokenizer;
    None without a tokenizer."""
    if not (Path(target_dir) / "tokenizer.json").is_file():
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target_dir))
    heldout = torch.tensor(encode_files(tok, [f.text for f in shipped_text().heldout]), dtype=torch.long)
    # Start half a spacing in (the windows of this toolkit's first release of this text).
    # The stream ends with an end-of-file token, which no window may contain: drop it.
    return sample_eval_prompts(heldout[len(heldout) // (2 * n) : -1], n, prompt_len, tok.eos_token_id).tolist()


def load_prompts(dataset: str, n: int, input_len: int, seed: int) -> list[str]:
    """`n` prompts of about `input_len` tokens, reproducible from `seed`."""
    rng = random.Random(seed)
    chars = int(input_len * CHARS_PER_TOKEN)
    if dataset == "random":
        words = [w for w in "the of and to in is for on that with as by at from this be are it an or".split()]
        return [" ".join(rng.choice(words) for _ in range(input_len)) for _ in range(n)]
    if dataset == "builtin:pystd-heldout":
        files = [f.text for f in shipped_text().heldout if len(f.text) > chars + 1]
        if not files:
            longest = max(len(f.text) for f in shipped_text().heldout)
            raise UserError(f"sweep.input_len: {input_len} tokens (~{chars} characters) is longer than every built-in "
                            f"held-out file (the longest has {longest} characters); use a JSONL dataset of longer "
                            "prompts")
        out = []
        for _ in range(n):
            text = rng.choice(files)
            start = rng.randrange(0, len(text) - chars)
            out.append(text[start : start + chars])
        return out
    path = Path(dataset)
    if not path.exists():
        raise UserError(f"sweep.dataset: {dataset!r} is not 'random', 'builtin:pystd-heldout' or an existing JSONL "
                        "file")
    prompts = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            prompts.append(json.loads(line)["prompt"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}:{i + 1}: expected a JSON object with a 'prompt' field") from None
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return [prompts[i % len(prompts)] for i in range(n)]
