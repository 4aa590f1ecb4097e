"""A Dynamo GenerateRequest as our request record (serve/dynamo_request.py), without Dynamo: the
request dicts are shaped as ai-dynamo 1.6.1's frontend hands them to a worker (its keys, nulls
for what the client left out)."""

import pytest

from trtllm_dflash.runtime.capabilities import FULL, Capabilities
from trtllm_dflash.serve.dynamo_request import Served, decoding, engine_data, finish_reason
from trtllm_dflash.serve.record import SpecStats, Update
from trtllm_dflash.serve.requests import Limits, RequestError
from trtllm_dflash.sweep.protocols import dynamo_annotations as annotations

SAMPLING = dict.fromkeys(("n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
                          "top_p", "top_k", "min_p", "use_beam_search", "length_penalty", "seed",
                          "include_stop_str_in_output", "guided_decoding"))
STOPS = {**dict.fromkeys(("max_tokens", "stop", "stop_token_ids", "stop_token_ids_visible", "min_tokens",
                          "ignore_eos", "max_thinking_tokens")), "stop_token_ids_hidden": [0]}
OUTPUT = dict.fromkeys(("logprobs", "prompt_logprobs", "skip_special_tokens", "formatted_prompt",
                        "return_tokens_as_token_ids"))
SERVED = Served(Limits(96, 160), 384, FULL, 32)


def request(sampling=None, stops=None, output=None, ids=(5, 6, 7), notes=()) -> dict:
    return {"model": "dflash", "token_ids": list(ids), "stop_conditions": {**STOPS, **(stops or {})},
            "sampling_options": {**SAMPLING, **(sampling or {})}, "output_options": {**OUTPUT, **(output or {})},
            "eos_token_ids": [0], "annotations": list(notes), "routing": {}}


def test_a_plain_request_takes_the_frontends_values():
    a = SERVED.parse(request({"temperature": 0.0, "top_k": -1, "seed": 7}, {"max_tokens": 12, "stop": ["\n\n"]}))
    assert (a.prompt_ids, a.max_tokens, a.stop_words, a.stop_token_ids) == ([5, 6, 7], 12, ("\n\n",), (0,))
    assert a.sampling.greedy and a.sampling.seed == 7 and a.sampling.top_k == 0
    assert (a.mode, a.draft_len) == (None, None)
    # unset: OpenAI's temperature 1 where the runners sample, the rest of max_seq_len (the frontend sends no default)
    a = SERVED.parse(request(stops={"stop_token_ids_hidden": []}))
    assert a.sampling.temperature == 1.0 and a.max_tokens == 160 - 3 and a.stop_token_ids == ()  # ignore_eos
    assert SERVED.parse(request(stops={"stop_token_ids_hidden": None})).stop_token_ids is None  # the target's eos


def test_the_decoding_comes_in_our_annotations_as_the_sweep_writes_them():
    assert annotations({"mode": "ar", "draft_len": 3}) == ["dflash.mode=ar", "dflash.draft_len=3"]
    assert decoding(["formatted_prompt", "dflash.mode=ddtree"]) == ("ddtree", None)  # Dynamo's own are not ours
    a = SERVED.parse(request(notes=annotations({"mode": "dflash", "draft_len": 0})))
    assert (a.mode, a.draft_len) == ("dflash", 0)


@pytest.mark.parametrize("req,message", [
    (request(notes=["dflash.mode=fast"]), "nvext.annotations: dflash.mode=fast: expected one of ar, dflash, ddtree"),
    (request(notes=["dflash.draft_len=-1"]), "nvext.annotations: dflash.draft_len=-1: expected an integer >= 0"),
    (request(notes=["dflash.speed=2"]), "nvext.annotations: 'dflash.speed=2': expected dflash.mode="),
    (request({"n": 2}), "n: 2 > 1: this worker returns one choice per request"),
    (request({"presence_penalty": 0.5}), "presence_penalty: not supported (only 0)"),
    (request({"repetition_penalty": 1.2}), "repetition_penalty: not supported (only 1)"),
    (request({"guided_decoding": {"json": {}}}), "guided_decoding: not supported"),
    (request(output={"logprobs": 2}), "logprobs: not supported"),
    (request(stops={"min_tokens": 4}), "min_tokens: not supported (only 0)"),
    (request({"top_p": 0.0}), "top_p: must be in (0, 1], got 0.0"),
    (request(stops={"max_tokens": 200}), "max_tokens: 200 > 157 (build limit max_seq_len 160 minus 3 prompt tokens)"),
    (request(ids=[1] * 97), "prompt: prompt is 97 tokens, longer than the build limit max_input_len 96"),
    (request(ids=[5, 384]), "prompt: token id 384 is outside the vocabulary [0, 384)"),
])
def test_what_our_openai_server_refuses_is_one_line_naming_the_field(req, message):
    with pytest.raises(RequestError) as e:
        SERVED.parse(req)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    # the neutral values pass
    assert SERVED.parse(request(output={"logprobs": 0}, sampling={"repetition_penalty": 1.0}))


def test_what_the_runners_cannot_decode_is_refused_and_ddtree_needs_a_budget():
    argmax = Served(Limits(96, 160), 384, Capabilities(full_logits=False, why_not="the engine returns argmax ids"),
                    None)
    with pytest.raises(RequestError, match="temperature: 0.7 samples, which needs the full verify logits"):
        argmax.parse(request({"temperature": 0.7}))
    assert argmax.parse(request()).sampling.temperature == 0.0  # unset: greedy there
    with pytest.raises(RequestError, match="dflash.mode: ddtree needs speculative.ddtree_budget"):
        argmax.parse(request(notes=["dflash.mode=ddtree"]))


def test_engine_data_is_our_openai_objects_and_finish_reasons_are_dynamos():
    spec = SpecStats.start(8).verified(7, 3).verified(0, 0).verified(7, 6)
    data = engine_data(Update("", 12, "length", spec, (1,)), "dflash", None, 7)
    assert list(data) == ["speculative_decoding", "avg_decoded_tokens_per_iter", "dflash"]
    assert data["speculative_decoding"] == {"acceptance_rate": 9 / 14, "total_accepted_draft_tokens": 9,
                                            "total_draft_tokens": 14, "num_spec_steps": 2,
                                            "acceptance_histogram": [0, 0, 0, 1, 0, 0, 1, 0], "num_spec_tokens": 7}
    assert data["avg_decoded_tokens_per_iter"] == 12 / 4 and data["dflash"] == {"mode": "dflash", "draft_len": None}
    ar = engine_data(Update("", 5, "stop", SpecStats.start(8).verified(0, 0), (1,)), "ar", None, 7)
    assert "speculative_decoding" not in ar  # nothing drafted: left out, as TensorRT-LLM PR #19311 does
    assert [finish_reason(r) for r in ("stop", "length", "cancelled", "error: x")] == ["stop", "length", "cancelled",
                                                                                       "error"]


def test_serve_takes_dynamos_runtime_flags_as_dynamo_defines_them(monkeypatch):
    """--namespace and --discovery-backend: the defaults, choices and environment variables of
    ai-dynamo 1.6.1's DynamoRuntimeArgGroup (dynamo/common/configuration/groups/runtime_args.py)."""
    import argparse

    groups = pytest.importorskip("dynamo.common.configuration.groups.runtime_args",
                                 reason="needs ai-dynamo (pip install --no-deps ai-dynamo==1.6.1)")
    from trtllm_dflash.cli import build_parser
    from trtllm_dflash.commands.serve import DISCOVERY_BACKENDS

    for var in ("DYN_NAMESPACE", "DYN_DISCOVERY_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    upstream = argparse.ArgumentParser()
    groups.DynamoRuntimeArgGroup().add_arguments(upstream)
    theirs = {a.dest: a for a in upstream._actions}
    ours = build_parser().parse_args(["serve", "--from", "x", "--api", "dynamo"])
    defaults = (theirs["namespace"].default, theirs["discovery_backend"].default)
    assert (ours.namespace, ours.discovery_backend) == defaults
    assert tuple(theirs["discovery_backend"].choices) == DISCOVERY_BACKENDS
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    assert build_parser().parse_args(["serve", "--from", "x"]).discovery_backend == "file"
