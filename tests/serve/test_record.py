"""The response record (serve/record.py) and the renderers of the two front ends that take it
without a server: the OpenAI responses (serve/openai_responses.py, byte for byte the JSON the
`openai` client reads) and the dflash model's tensors (serve/triton_outputs.py)."""

import json
from dataclasses import FrozenInstanceError

import numpy as np
import pytest

from trtllm_dflash.deploy.settings import DFLASH_OUTPUTS
from trtllm_dflash.policy.decision import FULL_BLOCK
from trtllm_dflash.serve.openai_responses import Reply, speculative_decoding
from trtllm_dflash.serve.record import Request, SpecStats, Update, draft_bound
from trtllm_dflash.serve.triton_outputs import DTYPES, LOG_PROBS, PERF_OUTPUTS, VALUES, output_names, tensors

SPEC = SpecStats.start(4).verified(3, 2).verified(3, 0).verified(1, 1, path=1)  # 3 passes, 3 of 7 accepted
FINAL = Update("end", 7, "length", SPEC, (5, 6))
# under a draft-length policy (num_spec_tokens null) the histogram is the deepest acceptance + 1 long
SPEC_JSON = {"acceptance_rate": 3 / 7, "total_accepted_draft_tokens": 3, "total_draft_tokens": 7, "num_spec_steps": 3,
             "acceptance_histogram": [1, 1, 1], "num_spec_tokens": None}


def reply(chat: bool, mode: str = "dflash", bound: int | None = None) -> Reply:
    return Reply(chat, "cmpl-1", 1700000000, "dflash", 4, mode, None, bound)


def test_spec_stats_count_passes_in_their_histogram():
    assert (SPEC.rounds, SPEC.drafted, SPEC.accepted, SPEC.path_drafted, SPEC.plain) == (3, 7, 3, 7, 0)
    assert SPEC.histogram == (1, 1, 1, 0) and SPEC.acceptance_rate == pytest.approx(3 / 7)
    assert SpecStats.start(2).verified(5, 4).histogram == (0, 0, 0, 0, 1)  # grows past its start
    assert SpecStats().acceptance_rate == 0.0
    assert FINAL.tokens == 2 and FINAL.acceptance_length == pytest.approx(6 / 3)
    # trtllm-serve's: output tokens per iteration, the prefill one of them (7 tokens, 3 passes + 1)
    assert FINAL.avg_decoded_tokens_per_iter == 7 / 4 and Update("", 0, "cancelled").avg_decoded_tokens_per_iter == 0


def test_the_round_loops_fast_records_equal_the_constructors_and_stay_frozen():
    built = SpecStats(3, 7, 3, (1, 1, 1, 0), 7, 0)
    assert SPEC == built and hash(SPEC) == hash(built) and repr(SPEC) == repr(built)
    fast = Update.of("end", 7, "length", SPEC, (5, 6), None, 0.0)
    assert fast == FINAL and hash(fast) == hash(FINAL) and repr(fast) == repr(FINAL)
    for record, name in ((SPEC, "rounds"), (fast, "text")):
        with pytest.raises(FrozenInstanceError):
            setattr(record, name, 0)


def test_a_request_is_immutable_all_the_way_down():
    r = Request([1, 2], 4, print, stop_sequences=[[3, 4]], bad_words=[[5]])
    assert r.prompt_ids == (1, 2) and r.stop_sequences == ((3, 4),) and r.bad_words == ((5,),)
    with pytest.raises(FrozenInstanceError):
        r.max_tokens = 8
    with pytest.raises(FrozenInstanceError):
        FINAL.text = ""


def test_whole_responses_are_the_wire_format_the_clients_read():
    """Key order, nulls and omitted fields as the hand-built dicts had them (JSON text compared)."""
    usage = {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "dflash"}
    want = {**head, "choices": [{"index": 0, "text": "end", "logprobs": None, "finish_reason": "length",
                                 "speculative_decoding": SPEC_JSON, "avg_decoded_tokens_per_iter": 1.75}],
            "usage": usage, "dflash": {"mode": "dflash", "draft_len": None}}
    assert json.dumps(reply(False).whole("end", FINAL).model_dump()) == json.dumps(want)
    chat = {**head, "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "end"}, "logprobs": None, "finish_reason": "length",
         "speculative_decoding": SPEC_JSON, "avg_decoded_tokens_per_iter": 1.75}], "usage": usage,
        "dflash": {"mode": "dflash", "draft_len": None}}
    assert json.dumps(reply(True).whole("end", FINAL).model_dump()) == json.dumps(chat)


def test_stream_chunks_carry_statistics_on_the_final_one_only():
    head = {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "dflash"}
    r = reply(True)
    assert r.first_chunk().model_dump() == {**head, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}
    running = Update("ab", 3, None, SPEC, (1,))
    assert json.dumps(r.chunk("ab", running).model_dump()) == json.dumps({**head, "choices": [
        {"index": 0, "delta": {"content": "ab"}, "logprobs": None, "finish_reason": None,
         "avg_decoded_tokens_per_iter": 0.75}]})  # every chunk with text, as trtllm-serve's
    final = r.chunk("end", FINAL).model_dump()
    assert list(final) == [*head, "choices", "dflash"] and final["choices"][0]["speculative_decoding"] == SPEC_JSON
    assert r.usage_chunk(FINAL).model_dump() == {**head, "choices": [], "usage": {
        "prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}}
    plain = reply(False).chunk("ab", running).model_dump()
    assert plain["object"] == "text_completion" and plain["choices"][0] == {
        "index": 0, "text": "ab", "logprobs": None, "finish_reason": None, "avg_decoded_tokens_per_iter": 0.75}


def test_a_request_naming_outputs_gets_those_alone_even_with_return_perf_metrics():
    """The sweep names its outputs and sets return_perf_metrics: anything more would be dropped by
    the bundled stub off the GIL (python_backend PR #390), so the model sends nothing more."""
    named = ["text_output", "rounds", "acceptance_histogram", "output_log_probs", "not_an_output"]
    assert output_names(named, True, False) == ["text_output", "rounds", "acceptance_histogram"]
    assert output_names(named, False, True) == ["text_output", "rounds", "acceptance_histogram", "output_log_probs"]
    unnamed = output_names([], True, False)
    assert set(PERF_OUTPUTS) <= set(unnamed) and "output_ids" not in unnamed and not set(LOG_PROBS) & set(unnamed)
    assert not set(PERF_OUTPUTS) & set(output_names([], False, False))


def test_every_declared_dflash_output_has_its_value_in_the_record():
    assert set(VALUES) == set(DTYPES) == {t.name for t in DFLASH_OUTPUTS}
    out = tensors(FINAL, output_names([], True, True))
    assert out["text_output"].tolist() == [b"end"] and "output_ids" not in out  # sent to a client naming it
    assert tensors(FINAL, ["output_ids"])["output_ids"].tolist() == [5, 6]
    assert out["rounds"].tolist() == [3] and out["acceptance_histogram"].tolist() == [1, 1, 1, 0]
    avg = out["avg_decoded_tokens_per_iter"]
    assert avg.tolist() == [1.75] and avg.dtype == np.float32
    assert out["acceptance_rate"].dtype == np.float32 and out["acceptance_length"].tolist() == [pytest.approx(2.0)]
    assert out["finish_reason"].tolist() == [b"length"] and tensors(FINAL, LOG_PROBS)["output_log_probs"].shape == (0,)
    assert all(a.ndim == 1 for a in out.values())


# TensorRT-LLM PR #19311's per-request object, rule by rule. Sources, NVIDIA/TensorRT-LLM@59de05be:
# PH = tensorrt_llm/serve/postprocess_handlers.py _build_spec_decode_stats, OP = tensorrt_llm/serve/
# openai_protocol.py SpeculativeDecodingStats, OS = tensorrt_llm/serve/openai_server.py OpenAIServer.__init__.


def spec_of(passes, start=16) -> SpecStats:
    """SpecStats after verify passes given as (drafted, accepted[, path])."""
    spec = SpecStats.start(start)
    for p in passes:
        spec = spec.verified(*p)
    return spec


def test_19311_the_object_is_left_out_when_nothing_was_drafted():
    """PH: `if drafted <= 0 or num_spec_steps <= 0: return None` (the field absent, not null)."""
    ar = spec_of([(0, 0)] * 5)
    assert ar.plain == 5 and speculative_decoding(ar, 15) is None
    whole = reply(False, "ar", 15).whole("abcdef", Update("abcdef", 6, "length", ar, (1,))).model_dump()
    assert "speculative_decoding" not in whole["choices"][0] and whole["choices"][0]["avg_decoded_tokens_per_iter"] == 1
    assert speculative_decoding(SpecStats(), None) is None  # nothing verified at all (a cancelled prefill)


def test_19311_steps_are_the_passes_that_drafted():
    """PH: `num_spec_steps = per_pos_drafted[0]` and `histogram[0] = num_spec_steps - per_pos_accepted[0]`:
    a pass that drafted nothing (a policy's 0) is no step; sum(histogram) = num_spec_steps (OP)."""
    spec = spec_of([(3, 2), (0, 0), (3, 0), (0, 0)])
    obj = speculative_decoding(spec, 15)
    assert spec.rounds == 4 and obj.num_spec_steps == 2 and obj.acceptance_histogram[:3] == [1, 0, 1]
    assert sum(obj.acceptance_histogram) == 2 and sum(j * n for j, n in enumerate(obj.acceptance_histogram)) == 2


def test_19311_num_spec_tokens_is_the_servers_bound_and_null_under_a_policy():
    """OS: `spec_decode_num_spec_tokens = speculative_config.max_draft_len`, None where
    `draft_len_schedule` is set: the server's setting, not the request's draft_len."""
    class Policy:
        modes = ("dflash",)

    class Engine:
        histogram_len, policy = 16, FULL_BLOCK  # no draft-length policy

    assert draft_bound(Engine, "dflash") == draft_bound(Engine, "ddtree") == 15
    Engine.policy = Policy()
    assert draft_bound(Engine, "dflash") is None and draft_bound(Engine, "ddtree") == 15


def test_19311_histogram_is_the_bound_plus_one_or_the_deepest_plus_one():
    """PH: `width = deepest if num_spec_tokens is None else max(deepest, num_spec_tokens)`,
    `[0] * (width + 1)`; deepest = the longest acceptance seen."""
    spec = spec_of([(3, 2), (3, 1)], start=4)
    assert speculative_decoding(spec, 15).acceptance_histogram == [0, 1, 1] + [0] * 13  # padded to the bound
    assert speculative_decoding(spec, None).acceptance_histogram == [0, 1, 1]
    assert speculative_decoding(spec_of([(15, 15)]), 3).acceptance_histogram == [0] * 15 + [1]  # never cut short
    assert speculative_decoding(spec_of([(3, 0)]), None).acceptance_histogram == [1]


def test_19311_trees_count_paths_not_nodes():
    """OP: total_draft_tokens "For tree drafting this counts paths, not tree nodes, mirroring the
    getMaxDraftPathLen clamp"; acceptance_rate = accepted / that (PH). The nodes go under our own
    `dflash.tree_draft_tokens`."""
    tree = spec_of([(32, 4, 15), (32, 15, 15)])
    obj = speculative_decoding(tree, 15)
    assert (obj.total_draft_tokens, obj.total_accepted_draft_tokens, obj.acceptance_rate) == (30, 19, 19 / 30)
    whole = reply(False, "ddtree", 15).whole("x", Update("x", 21, "length", tree, (1,))).model_dump()
    assert whole["dflash"] == {"mode": "ddtree", "draft_len": None, "tree_draft_tokens": 64}
    assert "tree_draft_tokens" not in reply(False, "dflash", 15).whole("x", FINAL).model_dump()["dflash"]


def test_19311_streams_carry_it_on_the_terminal_chunk_only():
    """PH: None while `finish_reason is None` (upstream's test_absent_on_non_terminal_stream_chunk)."""
    r = reply(False, "dflash", 15)
    assert "speculative_decoding" not in r.chunk("ab", Update("ab", 3, None, SPEC, (1,))).model_dump()["choices"][0]
    assert r.chunk("", FINAL).model_dump()["choices"][0]["speculative_decoding"]["num_spec_tokens"] == 15
