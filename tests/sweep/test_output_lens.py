"""sweep.output_len_range: every request asks for its own output length, the same for every curve.

With one length for all, closed-loop clients of a non-speculative curve finish together and admit
their successors between their own tokens, while speculation desyncs its requests, which then pay
every other request's prefill inside their own token stream: a spread of lengths puts both curves
under the same arrival process (docs/design/draft-length-history.md)."""

import asyncio
import json

import pytest

from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.rules import check
from trtllm_dflash.sweep.loadgen import Variant, run_level


def test_lengths_are_seeded_spread_and_bounded():
    sw = load_recipe(None, ["sweep.output_len=64", "sweep.output_len_range=0.5"]).sweep
    lens = sw.output_lens(400)
    assert lens == sw.output_lens(400) and lens[:10] == sw.output_lens(10)
    assert min(lens) >= 32 and max(lens) <= 96 == sw.max_output_len
    assert min(lens) < 40 and max(lens) > 88  # the whole range is used
    assert abs(sum(lens) / len(lens) - 64) < 3
    other = load_recipe(None, ["sweep.output_len=64", "sweep.output_len_range=0.5", "sweep.seed=1"]).sweep
    assert other.output_lens(400) != lens
    fixed = load_recipe(None, ["sweep.output_len=64"]).sweep
    assert fixed.output_lens(50) == [64] * 50 and fixed.max_output_len == 64


def test_the_longest_request_must_fit_the_sequence_limit():
    recipe = load_recipe(None, ["sweep.input_len=64", "sweep.output_len=300", "sweep.output_len_range=0.5"],
                         check_rules=False)
    problems = [p for p in check(recipe) if p.field == "sweep.output_len"]
    assert problems and "450" in problems[0].message  # 300 x 1.5 > max_seq_len 512 - 64
    fits = load_recipe(None, ["sweep.output_len_range=0.5"], check_rules=False)
    assert not [p for p in check(fits) if p.field == "sweep.output_len"]


class _Session:
    """aiohttp.ClientSession stand-in: each generate_stream request ends at once; records max_tokens."""

    sent: list[dict] = []

    def __init__(self, **_):
        pass

    def post(self, url, json):
        _Session.sent.append(json)
        return self

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    @property
    def content(self):
        async def lines():
            yield ("data: " + json.dumps({"text_output": "x", "output_token_count": 1,
                                          "finish_reason": "length"})).encode()
        return lines()

    async def close(self):
        pass


def test_each_request_asks_for_its_own_length_whatever_the_curve(monkeypatch):
    aiohttp = pytest.importorskip("aiohttp")
    monkeypatch.setattr(aiohttp, "ClientSession", _Session)
    lens = load_recipe(None, ["sweep.output_len=40", "sweep.output_len_range=0.5"]).sweep.output_lens(12)
    asked = {}
    for curve in (Variant("ar", "ar"), Variant("dflash")):
        _Session.sent = []
        recs = asyncio.run(run_level("127.0.0.1:9", "m", ["p"], 3, 10, 2, lens, 0, 0.0, protocol="http", variant=curve))
        assert [r.request_id for r in recs] == list(range(12)) and all(r.error is None for r in recs)
        asked[curve.name] = {b["seed"]: b["max_tokens"] for b in _Session.sent}  # seed = request id (seed 0)
    assert asked["ar"] == asked["dflash"] == dict(enumerate(lens))
