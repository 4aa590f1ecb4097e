"""Byte-level BPE tokenizer for the stdlib corpus, saved as a Hugging Face tokenizer.

Special tokens (fixed ids, before any merge):
- id 0 `<|endoftext|>`: separates files; also the eos and pad token;
- id 1 `<|mask|>`: the DFlash mask token. It is a real row of the target embedding
  (the target never sees it in training, so its row stays near its random init; the
  drafter learns to read it).

Byte-level means every string round-trips: there is no unknown token.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtllm_dflash.errors import UserError

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)  # ids 0 and 1, in this order


def train_tokenizer(texts, vocab_size: int = 4096, min_frequency: int = 2):
    """Train a byte-level BPE on `texts` (an iterable of strings); returns a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_base = 256 + len(SPECIAL_TOKENS)
    if vocab_size <= n_base:
        raise UserError(f"vocab_size={vocab_size} must exceed {n_base} (256 bytes + {len(SPECIAL_TOKENS)} specials)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, f"special token {s} got id {tok.token_to_id(s)}, expected {i}"
    # (alike only in form to recipe/plan/fit.py's MemoryPlan(...) keyword list: unrelated, not merged)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer, path: str | Path) -> None:
    """save_pretrained, with `tokenizer_class` set to PreTrainedTokenizerFast.

    transformers 5 writes its own class name (`TokenizersBackend`), which transformers 4.x
    (the TensorRT-LLM 1.2 containers) cannot resolve; PreTrainedTokenizerFast loads in both.
    """
    path = Path(path)
    tokenizer.save_pretrained(str(path))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved by `save_tokenizer` (or any HF tokenizer directory)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"{path} has no tokenizer.json; train one with `python -m trtllm_dflash.train.tokenizer --out "
                        f"{path}`")
    return AutoTokenizer.from_pretrained(str(path))


def main(argv: list[str] | None = None) -> int:
    from trtllm_dflash.prompts.corpus import load_corpus
    from trtllm_dflash.prompts.sources import encode_files

    ap = argparse.ArgumentParser(description="Train the byte-level BPE tokenizer on the train split of the stdlib "
                                             "corpus.")
    ap.add_argument("--out", type=Path, required=True, help="directory for tokenizer.json + tokenizer_config.json")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--heldout-fraction", type=float, default=0.05)
    args = ap.parse_args(argv)

    corpus = load_corpus(heldout_fraction=args.heldout_fraction)
    tok = train_tokenizer([f.text for f in corpus.train], args.vocab_size, args.min_frequency)
    args.out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, args.out)
    n_train = len(encode_files(tok, [f.text for f in corpus.train]))
    n_held = len(encode_files(tok, [f.text for f in corpus.heldout]))
    print(
        f"tokenizer: vocab {len(tok)}, eos {tok.eos_token_id}, mask {tok.mask_token_id}; "
        f"train {n_train} tokens ({corpus.info.train_chars / n_train:.2f} chars/token), "
        f"held-out {n_held} tokens -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
