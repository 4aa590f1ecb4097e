"""Batch > 1: ragged prompts, per-request limits and stop ids, ragged acceptance; the
batched result equals decoding each request alone, with one target pass and one drafter
pass per round for the whole batch."""

import importlib

import pytest
from test_greedy import install_oracle, prompts_for

from trtllm_dflash.reference import generate, generate_steps, load_pair

loop = importlib.import_module("trtllm_dflash.reference.generate")


@pytest.fixture(params=["qwen3_pair", "llama_pair"])
def models(request):
    return load_pair(*request.getfixturevalue(request.param))


def count_calls(monkeypatch, module, name):
    calls = [0]
    real = getattr(module, name)

    def counted(self, *a, **k):
        calls[0] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("mode", ["ar", "dflash", "ddtree"])
@pytest.mark.parametrize("oracle", [False, True])
def test_batched_equals_single(models, monkeypatch, mode, oracle):
    target, drafter = models
    prompts = prompts_for(11, n=4)
    limits = [40, 7, 25, 33]
    alone = [generate(target, drafter, [p], n, mode=mode, stop_token_ids=[])[0].tokens for p, n in zip(prompts, limits)]
    stops = [[], [], [alone[2][12]], []]  # request 2 stops on a token it really produces
    expect = list(alone)
    expect[2] = alone[2][: alone[2].index(stops[2][0]) + 1]
    if oracle:  # drafts = the true future, corrupted every 3rd round: acceptance differs per row
        install_oracle(monkeypatch, [p + a for p, a in zip(prompts, alone)], corrupt_every=3)
    t_calls = count_calls(monkeypatch, type(target), "forward")
    d_calls = count_calls(monkeypatch, type(drafter), "forward")
    records = list(generate_steps(target, drafter, prompts, limits, mode=mode, stop_token_ids=stops))
    got = [[] for _ in prompts]
    for rec in records:
        for r, toks in zip(rec.seq_ids, rec.tokens):
            got[r] += toks
    assert got == expect
    assert [rec.finished[rec.seq_ids.index(2)] for rec in records if 2 in rec.seq_ids][-1] == "stop"
    assert t_calls[0] == len(records)  # prefill + one batched target pass per round
    rounds = len(records) - 1
    # one batched drafter pass per round, except a last round with one token left to make
    assert d_calls[0] == 0 if mode == "ar" else rounds - 1 <= d_calls[0] <= rounds
    if oracle and mode != "ar":
        ragged = [rec for rec in records[1:] if len({len(t) for t in rec.tokens}) > 1 and len(rec.seq_ids) > 1]
        assert ragged  # rounds where sequences in the same batch accepted different amounts


def test_pooled_tau_weighs_requests_by_their_rounds():
    from trtllm_dflash.reference import Generation, Stats, pooled_tau

    long = Generation([0] * 9, Stats(rounds=3, accepted_per_round=[4, 4, 1]), "length")  # tau 3
    short = Generation([0], Stats(rounds=1, accepted_per_round=[1]), "length")  # tau 1
    assert pooled_tau([long, short]) == 10 / 4  # not the mean of per-request taus (2.0)
    assert pooled_tau([Generation([0], Stats(), "stop")]) == 0.0  # finished at the prefill: no rounds
