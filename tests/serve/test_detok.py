"""Incremental detokenization (serve/detok.py) reads as whole-sequence decoding: at every step the
streamed text is the whole decode less a character whose bytes are not all there yet, and the
served stream (serve/batcher.py) concatenates to exactly the whole decode, cut at a stop word,
whatever rounds the tokens arrive in. Tokenizers: the tiny pair's, a Qwen-style byte-level BPE and
a Llama-style SentencePiece BPE (Metaspace, byte fallback) built here with `tokenizers`, on text
with emoji and CJK characters split across tokens, merged tokens and special tokens."""

import random
import threading

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from trtllm_dflash.serve.detok import (
    REPLACEMENT,
    ByteStream,
    WholeStream,
    WindowStream,
    _byte_table,
    stream_for,
    whole_decode,
)

TEXT = ("def 你好(x):\n    return x + '😀👍🏽' # ünïcödé — 世界, café 🇫🇷\n"
        "print(\"日本語のテキスト\") and the quick brown fox 🦊 jumps; emoji: 🧑‍💻 done.\n") * 3
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_level_bpe():
    """Qwen2's shape: a GPT-2 style regex split, byte-level model and decoder, special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    split = Regex(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                  r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(split, "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT, "hello world " * 20], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", clean_up_tokenization_spaces=False)


def _sentencepiece_bpe():
    """Llama 2's shape: Metaspace pieces, byte-fallback tokens <0xNN> in the vocabulary for what it
    lacks (emoji here), special tokens."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60)
    no_emoji = "".join(c for c in TEXT if ord(c) < 0x2000)  # emoji and CJK reach the stream as byte tokens
    tok.train_from_iterator([no_emoji, "hello world " * 20], trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(256):  # the byte tokens, as Llama's vocabulary has them
        vocab.setdefault(f"<0x{i:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module", params=["tiny-pystd", "byte-level-bpe", "sentencepiece-bpe"])
def tokenizer(request):
    if request.param == "tiny-pystd":
        from trtllm_dflash.recipe import load_recipe

        return AutoTokenizer.from_pretrained(str(load_recipe(None).target.path))
    return _byte_level_bpe() if request.param == "byte-level-bpe" else _sentencepiece_bpe()


def _ids(tokenizer) -> list[int]:
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    return ids[:40] + [eos] + ids[40:] + [eos]  # special tokens inside and at the end


def _chunks(ids, rng):
    i = 0
    while i < len(ids):
        n = rng.randint(1, 9)
        yield ids[i : i + n]
        i += n


def _stream(kind, tokenizer, skip):
    backend = tokenizer.backend_tokenizer
    if kind is ByteStream:
        if type(backend.decoder).__name__ != "ByteLevel":
            pytest.skip("not a byte-level decoder")
        return ByteStream(_byte_table(backend), skip)
    if kind is WindowStream:
        return WindowStream(lambda ids: whole_decode(tokenizer, ids, skip))
    return kind(tokenizer, skip)


@pytest.mark.parametrize("kind", [ByteStream, WindowStream, WholeStream])
@pytest.mark.parametrize("skip", [False, True])
def test_every_step_reads_as_the_whole_decode(tokenizer, kind, skip):
    """At every step a prefix of the whole decode of every token; ByteStream exactly the whole
    decode so far less an incomplete character (a byte-level decode only grows). The others may
    hold a round's tokens back until its characters complete (WholeStream: with byte fallback, a
    run of byte tokens decodes to U+FFFDs until it is whole)."""
    ids, rng = _ids(tokenizer), random.Random(3)
    _stream(kind, tokenizer, skip)  # skips a kind this tokenizer has not
    assert any(REPLACEMENT in whole_decode(tokenizer, ids[:n], skip) for n in range(len(ids))), \
        "the text should split a character across tokens somewhere"
    final = whole_decode(tokenizer, ids, skip)
    for _ in range(4):
        stream, seen = _stream(kind, tokenizer, skip), []
        for chunk in _chunks(ids, rng):
            seen += chunk
            assert stream.add(chunk) == stream.text
            if kind is ByteStream:
                assert stream.text == whole_decode(tokenizer, seen, skip).rstrip(REPLACEMENT)
            if kind is not WholeStream:
                assert final.startswith(stream.text), (stream.text[-20:], final[len(stream.text) - 20:][:40])
        assert stream.text == final


def test_random_token_ids_decode_as_the_whole(tokenizer):
    """Any ids, invalid UTF-8 between them included: a byte-level stream is the whole decode at
    every step (less what its UTF-8 decoder holds), and ends exactly as it."""
    if type(tokenizer.backend_tokenizer.decoder).__name__ != "ByteLevel":
        pytest.skip("not a byte-level decoder (WindowStream: exact on valid UTF-8, see serve/detok.py)")
    rng = random.Random(7)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 60))]
        stream, seen = _stream(ByteStream, tokenizer, False), []
        for chunk in _chunks(ids, rng):
            seen += chunk
            stream.add(chunk)
            assert whole_decode(tokenizer, seen, False).startswith(stream.text)
        assert stream.text + stream.utf8.decode(b"", final=True) == whole_decode(tokenizer, ids, False)


def test_stream_for_picks_the_tokenizers_incremental_decoder(tokenizer):
    byte_level = type(tokenizer.backend_tokenizer.decoder).__name__ == "ByteLevel"
    assert isinstance(stream_for(tokenizer), ByteStream if byte_level else WindowStream)

    class Plain:  # a tokenizer with nothing but decode(ids)
        def decode(self, ids):
            return tokenizer.decode(ids)

    assert isinstance(stream_for(Plain()), WindowStream)
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert isinstance(stream_for(tokenizer), WholeStream)  # clean-up may rewrite streamed text
    finally:
        tokenizer.clean_up_tokenization_spaces = False


def _serve(tokenizer, ids, **job):
    """The tokens through ServingEngine over zero-cost runners (perf/zero_cost.py): the updates."""
    from trtllm_dflash.perf.zero_cost import Scripts, ZeroCostModel
    from trtllm_dflash.serve.batcher import ServingEngine
    from trtllm_dflash.serve.record import Request

    prompt = [5, 6, 7]
    scripts = Scripts({tuple(prompt): ids + [0] * 40}, (0.7,) * 7, 100_000, seed=1)
    model = ZeroCostModel(scripts, vocab=100_000, hidden=8, block=8, max_batch=2)
    engine = ServingEngine(model, tokenizer, block_size=8, max_seq_len=len(ids) + 64)
    updates, done = [], threading.Event()
    try:
        engine.submit(Request(prompt, len(ids), lambda u: (updates.append(u), u.finish_reason and done.set()),
                          stop_token_ids=[], **job))
        assert done.wait(60)
    finally:
        engine.stop()
    return updates


@pytest.mark.parametrize("skip", [False, True])
def test_served_text_is_the_whole_decode(tokenizer, skip):
    ids = _ids(tokenizer)
    updates = _serve(tokenizer, ids, skip_special_tokens=skip)
    assert updates[-1].finish_reason == "length"
    assert [t for u in updates for t in u.ids] == ids  # greedy: the script, token for token
    assert "".join(u.text for u in updates) == whole_decode(tokenizer, ids, skip)


def test_served_stop_words_cut_and_hold_back(tokenizer):
    ids = _ids(tokenizer)
    full = whole_decode(tokenizer, ids, False)
    word = "世界, caf"  # multi-byte characters inside the stop word
    updates = _serve(tokenizer, ids, stop_words=[word, "never there"])
    text = "".join(u.text for u in updates)
    assert updates[-1].finish_reason == "stop" and text == full[: full.find(word)]
    for k in range(1, len(updates)):  # no update ever sent a prefix of the stop word that it then took back
        assert text.startswith("".join(u.text for u in updates[:k]))
