"""Request validation of the dflash Triton model: each bad value is named."""

import numpy as np
import pytest

from trtllm_dflash.serve.requests import Limits, RequestError, check_lengths, check_mode, parse_request


def req(**kw):
    inputs = {"text_input": np.array([b"def f():"], dtype=object), "max_tokens": np.array([16], dtype=np.int32)}
    inputs.update(kw)
    return inputs


def test_valid_request_with_all_options():
    r = parse_request(req(
        temperature=np.array([0.7], np.float32), top_p=np.array([0.9], np.float32), top_k=np.array([20], np.int32),
        seed=np.array([7], np.uint64), stop_words=np.array([b"\n\n", b""], dtype=object), stream=np.array([True]),
    ))
    assert (r.prompt, r.max_tokens, r.top_k, r.seed, r.stop_words, r.stream) == ("def f():", 16, 20, 7, ["\n\n"], True)
    assert r.temperature == pytest.approx(0.7) and r.top_p == pytest.approx(0.9)


@pytest.mark.parametrize(
    "inputs,message",
    [
        (dict(text_input=np.array([b""], dtype=object)), "text_input: empty prompt"),
        (dict(text_input=np.array([b"\xff\xfe"], dtype=object)), "text_input: not valid UTF-8"),
        (dict(text_input=np.array([b"a", b"b"], dtype=object)), "one prompt per request"),
        (dict(max_tokens=np.array([0], np.int32)), "max_tokens: must be > 0, got 0"),
        (dict(max_tokens=np.array([-3], np.int32)), "max_tokens: must be > 0, got -3"),
        (dict(max_tokens=np.array([1.5], np.float32)), "max_tokens: expected an integer value"),
        (dict(temperature=np.array([-0.1], np.float32)), "temperature: must be >= 0"),
        (dict(top_p=np.array([0.0], np.float32)), "top_p: must be in (0, 1], got 0.0"),
        (dict(top_p=np.array([1.5], np.float32)), "top_p: must be in (0, 1]"),
        (dict(top_k=np.array([-1], np.int32)), "top_k: must be >= 0"),
        (dict(exclude_input_in_output=np.array([False])), "exclude_input_in_output: only true"),
        (dict(mode=np.array([b"tree"], dtype=object)), "mode: expected one of ar, dflash, ddtree, got 'tree'"),
        (dict(draft_len=np.array([-2], np.int32)), "draft_len: must be >= 0"),
    ],
)
def test_bad_values_are_named(inputs, message):
    with pytest.raises(RequestError) as e:
        parse_request(req(**inputs))
    assert message in str(e.value)


def test_missing_inputs():
    with pytest.raises(RequestError, match="max_tokens: required"):
        parse_request({"text_input": np.array([b"x"], dtype=object)})


def test_length_limits():
    limits = Limits(max_input_len=8, max_seq_len=20)
    check_lengths(8, 12, limits)
    with pytest.raises(RequestError, match="prompt is 9 tokens, longer than the build limit max_input_len 8"):
        check_lengths(9, 1, limits)
    with pytest.raises(RequestError, match=r"max_tokens: 13 > 12 \(build limit max_seq_len 20 minus 8 prompt tokens\)"):
        check_lengths(8, 13, limits)


def test_mode_is_per_request_and_ddtree_needs_the_deployments_budget():
    assert parse_request(req()).mode is None  # the deployment's own mode
    assert parse_request(req(mode=np.array([b"AR"], dtype=object))).mode == "ar"
    check_mode("ddtree", 32)
    check_mode("ar", None)
    with pytest.raises(RequestError, match="mode: ddtree needs speculative.ddtree_budget in the deployed recipe"):
        check_mode("ddtree", None)


def test_token_words_in_tensorrtllm_backends_layout():
    """[2, N]: the sequences' ids one after another, then their cumulative ends padded with -1
    (tensorrtllm_backend preprocessing's _to_word_list_format); text words are tokenized."""
    ids = np.array([[[5, 6, 7, 9, 0], [2, 3, -1, -1, -1]]], np.int32)
    r = parse_request(req(stop_words_list=ids, bad_words=np.array([b"ab", b""], dtype=object),
                          stop_sequences=np.array([b"c"], dtype=object), return_log_probs=np.array([True])))
    assert r.stop_ids == [[5, 6], [7]] and r.bad_words == ["ab"] and r.return_log_probs
    encode = {"ab": [1, 2], "c": [3]}.get
    assert r.token_words(encode) == ([[5, 6], [7], [3]], [[1, 2]])


@pytest.mark.parametrize("arr,message", [
    (np.array([1, 2, 3], np.int32), r"expected integer ids shaped \[2, N\]"),
    (np.array([[1, 2], [2.0, -1]], np.float32), "expected integer ids"),
    (np.array([[1, 2, 3], [2, 1, -1]], np.int32), "not increasing"),
    (np.array([[1, 2], [3, -1]], np.int32), "not increasing within the 2 ids"),
])
def test_bad_word_lists_are_named(arr, message):
    with pytest.raises(RequestError, match=message):
        parse_request(req(bad_words_list=arr))


def test_an_argmax_only_model_refuses_what_needs_the_full_logits_naming_the_field():
    from trtllm_dflash.runtime.capabilities import ARGMAX_ONLY, FULL
    from trtllm_dflash.serve.requests import check_decodable

    check_decodable(FULL, temperature=1.0, bad_words=True, logprobs=True)  # the reference runners decode all
    check_decodable(ARGMAX_ONLY, temperature=0.0)  # greedy: fine
    for kwargs, field in ((dict(temperature=0.7), "temperature"), (dict(bad_words=True), "bad_words_list"),
                          (dict(logprobs=True), "return_log_probs")):
        with pytest.raises(RequestError, match=rf"^{field}: .* needs the full verify logits, and this engine-backend"):
            check_decodable(ARGMAX_ONLY, fields=("temperature", "bad_words_list", "return_log_probs"), **kwargs)


def test_the_openai_default_temperature_is_greedy_on_an_argmax_only_model():
    """OpenAI's default temperature is 1; an engine deployment can only decode greedily, so there an
    unset temperature means 0 and an explicit temperature > 0 is a 400 naming the field."""
    from types import SimpleNamespace

    from trtllm_dflash.runtime.capabilities import ARGMAX_ONLY, FULL
    from trtllm_dflash.serve.openai_bodies import CompletionBody, OpenAIError
    from trtllm_dflash.serve.openai_service import Service

    def service(capabilities):
        tok = SimpleNamespace(decode=lambda ids: "", chat_template=None)
        model = SimpleNamespace(capabilities=capabilities, eos_token_ids=(0,))
        engine = SimpleNamespace(ddtree_budget=None)
        return Service(SimpleNamespace(tokenizer=tok, model=model, engine=engine), "m")

    body = CompletionBody(model="m", prompt="x")
    assert service(FULL).temperature(body) == 1.0 and service(ARGMAX_ONLY).temperature(body) == 0.0
    assert service(ARGMAX_ONLY).parse(b'{"model": "m", "prompt": "x", "temperature": 0}', CompletionBody)
    with pytest.raises(OpenAIError) as e:
        service(ARGMAX_ONLY).parse(b'{"model": "m", "prompt": "x", "temperature": 0.5}', CompletionBody)
    assert e.value.status == 400 and e.value.param == "temperature" and "full verify logits" in e.value.message
