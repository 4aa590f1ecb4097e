"""Byte-level BPE: round trip, special ids, HF save/load."""

import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from trtllm_dflash.errors import UserError
from trtllm_dflash.prompts.corpus import list_files
from trtllm_dflash.prompts.sources import encode_files
from trtllm_dflash.train.tokenizer import (
    EOS_TOKEN,
    MASK_TOKEN,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

SAMPLES = [
    "def f(x):\n    return x + 1\n",
    "\tif  a:\r\n\t\tpass  # tabs, CRLF, double spaces\n",
    "s = 'caf\u00e9 \u4e2d\u6587 \U0001f600'\n",  # multi-byte UTF-8 never seen in training
    "",
    "<|endoftext|> appears literally",
]


@pytest.fixture(scope="module")
def small_texts():
    return [f.text for f in list_files()[:20]]


@pytest.fixture(scope="module")
def tok(small_texts):
    return train_tokenizer(small_texts, vocab_size=512)


def test_round_trip_and_specials(tok):
    assert len(tok) == 512
    assert tok.eos_token_id == tok.pad_token_id == tok.convert_tokens_to_ids(EOS_TOKEN) == 0
    assert tok.mask_token_id == tok.convert_tokens_to_ids(MASK_TOKEN) == 1
    for s in SAMPLES[:4]:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert 0 not in ids and 1 not in ids
        assert tok.decode(ids) == s
    # A literal special string in text becomes the special id.
    assert tok(SAMPLES[4], add_special_tokens=False)["input_ids"][0] == 0


def test_training_is_deterministic(tok, small_texts):
    again = train_tokenizer(small_texts, vocab_size=512)
    assert again.get_vocab() == tok.get_vocab()
    assert again(SAMPLES[0])["input_ids"] == tok(SAMPLES[0])["input_ids"]


def test_save_and_load_with_auto_tokenizer(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    for loaded in (AutoTokenizer.from_pretrained(str(tmp_path)), PreTrainedTokenizerFast.from_pretrained(str(tmp_path)),
                   load_tokenizer(tmp_path)):
        assert (loaded.eos_token_id, loaded.mask_token_id, loaded.pad_token_id) == (0, 1, 0)
        for s in SAMPLES:
            assert loaded(s)["input_ids"] == tok(s)["input_ids"]


def test_encode_files_appends_eos(tok):
    ids = encode_files(tok, ["a = 1\n", "b = 2\n"])
    first = tok("a = 1\n", add_special_tokens=False)["input_ids"]
    assert ids[: len(first) + 1] == first + [0]
    assert ids[-1] == 0 and ids.count(0) == 2


def test_errors(tmp_path, small_texts):
    with pytest.raises(UserError, match="vocab_size"):
        train_tokenizer(small_texts, vocab_size=200)
    with pytest.raises(UserError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
