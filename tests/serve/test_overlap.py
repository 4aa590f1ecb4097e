"""ServingEngine(overlap=True): each round's step on a device thread while the engine thread delivers
the round before. The stand-in's verify waits 2 ms without the GIL (perf/zero_cost.py device_s, as
a CUDA synchronisation); what is served must be what the serial loop serves, token for token and
byte for byte, stop words and stop sequences included (they end a request a round late in the
decoder, unseen)."""

import threading

import pytest
from transformers import AutoTokenizer

from trtllm_dflash.perf.zero_cost import Scripts, ZeroCostModel
from trtllm_dflash.serve.batcher import ServingEngine
from trtllm_dflash.serve.record import Request

TEXT = "def add(a, b):\n    return a + b  # café, 世界\n\nclass Point:\n    x: int = 0\n" * 3


@pytest.fixture(scope="module")
def tokenizer():
    from trtllm_dflash.recipe import load_recipe

    return AutoTokenizer.from_pretrained(str(load_recipe(None).target.path))


def _serve(tokenizer, overlap: bool) -> list[tuple]:
    """(ids, text, finish reason) of 6 requests served together: two plain, two ended by a stop
    word, one by a stop sequence, one by its length."""
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    prompts = [[5, 6, k] for k in range(6)]
    scripts = Scripts({tuple(p): ids[k:] + [0] * 40 for k, p in enumerate(prompts)}, (0.7,) * 7, 100_000, seed=3)
    model = ZeroCostModel(scripts, vocab=100_000, hidden=8, block=8, max_batch=6, device_s=0.002)
    engine = ServingEngine(model, tokenizer, block_size=8, max_seq_len=len(ids) + 64, overlap=overlap)
    asks = [{}, {}, {"stop_words": ["Point"]}, {"stop_words": ["世界", "never"]},
            {"stop_sequences": [ids[30:32]]}, {"max_tokens": 9}]
    updates = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]
    try:
        for k, (p, ask) in enumerate(zip(prompts, asks)):
            emit = (lambda k: lambda u: (updates[k].append(u), u.finish_reason and done[k].set()))(k)
            engine.submit(Request(p, ask.pop("max_tokens", len(ids) - 6), emit, stop_token_ids=[], **ask))
        assert all(d.wait(60) for d in done)
    finally:
        engine.stop()
    return [([t for u in us for t in u.ids], "".join(u.text for u in us), us[-1].finish_reason) for us in updates]


def test_overlap_serves_what_the_serial_loop_serves(tokenizer):
    serial, overlapped = _serve(tokenizer, False), _serve(tokenizer, True)
    assert [r[2] for r in serial] == ["length", "length", "stop", "stop", "stop", "length"]
    assert overlapped == serial
