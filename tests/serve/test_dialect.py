"""tensorrtllm_backend's dialect without a server: the declared tensors (deploy/dialect.py) and the
request / response mapping to the dflash model (serve/dialect.py). The served behaviour is
tests/serve/test_dialect_server.py."""

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_dflash.deploy.dialect import DIALECT_MODELS, dialect_model_config
from trtllm_dflash.deploy.settings import DFLASH_INPUTS
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.serve.dialect import to_dflash, to_dflash_batch, to_dialect
from trtllm_dflash.serve.dialect_inputs import handled
from trtllm_dflash.serve.record import SpecStats, Update
from trtllm_dflash.serve.requests import RequestError, parse_request
from trtllm_dflash.serve.triton_outputs import output_names, tensors


def one(value, dtype=None):
    """A batch-first [1, 1] input."""
    return np.array([[value]], dtype=dtype)


def text(prompt=b"hi", max_tokens=8, **extra):
    return {"text_input": one(prompt, object), "max_tokens": one(max_tokens, np.int32), **extra}


@pytest.mark.parametrize("model", sorted(DIALECT_MODELS))
def test_every_declared_input_is_mapped_ignored_or_refused(model):
    _, inputs, _ = DIALECT_MODELS[model]
    assert [t.name for t in inputs if not handled(t.name)] == []
    assert len({t.name for t in inputs}) == len(inputs)


@pytest.mark.parametrize("model,name,dtype,dims", [
    # Upstream's 1.2.x templates (deploy/dialect.py names the files and commits).
    ("ensemble", "text_input", mc.TYPE_STRING, [1]),
    ("ensemble", "max_tokens", mc.TYPE_INT32, [1]),
    ("ensemble", "stop_words", mc.TYPE_STRING, [-1]),
    ("ensemble", "seed", mc.TYPE_UINT64, [1]),
    ("tensorrt_llm_bls", "num_draft_tokens", mc.TYPE_INT32, [1]),
    ("tensorrt_llm", "input_ids", mc.TYPE_INT32, [-1]),
    ("tensorrt_llm", "stop_words_list", mc.TYPE_INT32, [2, -1]),
    ("tensorrt_llm", "runtime_top_k", mc.TYPE_INT32, [1]),
])
def test_inputs_have_the_template_types_and_the_configs_are_batch_first(model, name, dtype, dims):
    cfg = dialect_model_config(load_recipe(None), model)
    assert cfg.max_batch_size > 0 and cfg.model_transaction_policy.decoupled
    (t,) = [t for t in cfg.input if t.name == name]
    assert (t.data_type, list(t.dims)) == (dtype, dims)
    outputs = {t.name: (t.data_type, list(t.dims)) for t in cfg.output}
    main = {"text_output": (mc.TYPE_STRING, [-1])} if model != "tensorrt_llm" else \
        {"output_ids": (mc.TYPE_INT32, [-1, -1]), "sequence_length": (mc.TYPE_INT32, [-1])}
    assert main.items() <= outputs.items() and "rounds" in outputs and "total_draft_tokens" in outputs


def test_a_text_request_becomes_a_dflash_request_the_dflash_parser_accepts():
    fwd = to_dflash("text", text(random_seed=one(7, np.uint64), stop_words=np.array([[b"\n", b""]], dtype=object),
                                 end_id=one(3, np.int32), pad_id=one(0, np.int32), beam_width=one(1, np.int32),
                                 repetition_penalty=one(1.0, np.float32), prompt_vocab_size=one(0, np.int32),
                                 temperature=one(0.5, np.float32), top_p=one(0.9, np.float32),
                                 stream=one(True, bool)))
    req = parse_request(fwd.inputs)  # what the dflash model will make of it
    assert (req.prompt, req.max_tokens, req.seed, req.stop_sequences, req.end_id, req.temperature, req.top_p,
            req.top_k, req.stream) == ("hi", 8, 7, ["\n"], 3, 0.5, np.float32(0.9), 0, True)
    assert req.stop_words == []  # upstream's stop words are token-level and kept, not dflash's text cut
    assert fwd.echo is None  # streamed: never the prompt


@pytest.mark.parametrize("sampling,want", [
    ({}, (0.0, 0, 1.0)),  # upstream's defaults: top_k 0 and top_p 0 decode greedily
    ({"temperature": 1.0}, (0.0, 0, 1.0)),  # whatever the temperature
    ({"temperature": 0.7, "top_k": 1}, (0.0, 0, 1.0)),  # top_k 1 is greedy too
    ({"top_k": 5}, (1.0, 5, 1.0)),  # sampling, upstream's temperature default 1.0
    ({"temperature": 0.5, "top_k": 5, "top_p": 0.0}, (0.5, 5, 1.0)),  # top_p 0 with a top_k: no top-p
    ({"top_p": 0.5}, (1.0, 0, 0.5)),
])
def test_sampling_follows_upstream_defaults(sampling, want):
    dtypes = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32}
    req = parse_request(to_dflash("text", text(**{k: one(v, dtypes[k]) for k, v in sampling.items()})).inputs)
    assert (req.temperature, req.top_k, req.top_p) == pytest.approx(want)


def test_token_ids_are_cut_at_input_lengths_and_echoed_when_not_streamed():
    fwd = to_dflash("ids", {"input_ids": np.array([[5, 6, 7, 0]], np.int32), "input_lengths": one(3, np.int32),
                            "request_output_len": one(4, np.int32), "runtime_top_k": one(2, np.int32)})
    req = parse_request(fwd.inputs)
    assert (req.prompt_ids, req.max_tokens, req.top_k, req.stream) == ([5, 6, 7], 4, 2, False)
    out = to_dialect(fwd, dflash_response(fwd))
    assert out["output_ids"].tolist() == [[[5, 6, 7, 9, 10]]] and out["sequence_length"].tolist() == [[5]]
    assert out["rounds"].shape == (1, 1) and out["finish_reason"][0, 0] == b"length"


@pytest.mark.parametrize("inputs,message", [
    (text(beam_width=one(2, np.int32)), "beam_width: 2 is not supported"),
    (text(num_return_sequences=one(3, np.int32)), "num_return_sequences: 3"),
    (text(presence_penalty=one(0.5, np.float32)), "presence_penalty: 0.5 is not supported"),
    (text(lora_weights=np.ones((1, 2, 3), np.float16)), "lora_weights: LoRA"),
    (text(return_num_input_tokens=one(True, bool)), "return_num_input_tokens"),
    (text(seed=one(1, np.uint64), random_seed=one(2, np.uint64)), "random_seed: give seed or random_seed"),
    ({"text_input": np.array([[b"a"], [b"b"]], object), "max_tokens": np.array([[1], [1]], np.int32)},
     "shape [2, 1]: send one prompt per request"),
    ({"text_input": one(b"a", object)}, "max_tokens: required"),
])
def test_what_cannot_be_honoured_is_named(inputs, message):
    with pytest.raises(RequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        to_dflash("text", inputs)


def test_the_dflash_model_still_needs_a_prompt():
    names = {t.name for t in DFLASH_INPUTS}
    assert {"input_ids", "end_id"} <= names
    with pytest.raises(RequestError, match="text_input: required"):
        parse_request({"max_tokens": np.array([3], np.int32)})
    with pytest.raises(RequestError, match="give text_input or input_ids, not both"):
        parse_request({"text_input": np.array([b"a"], object), "input_ids": np.array([1], np.int32),
                       "max_tokens": np.array([3], np.int32)})


DTYPES = {mc.TYPE_FP32: np.float32, mc.TYPE_INT32: np.int32, mc.TYPE_INT64: np.int64, mc.TYPE_STRING: np.object_}


def dflash_response(fwd, ids=(9, 10), reason="length", lps=None, cum=0.0, text="xy", spec=SpecStats(1, 4, 1, (0, 1))):
    """What the dflash model answers `fwd` with: its renderer (serve/triton_outputs.py) of one Update."""
    update = Update(text, len(ids), reason, spec, tuple(ids), lps, cum)
    return tensors(update, output_names(fwd.dflash_outputs, False, fwd.log_probs))


def perf_response(fwd, hist=(3, 1, 2, 0)):
    """A dflash model's final response: 6 passes, 5 drafts accepted of 12 (and the histogram saying so)."""
    return dflash_response(fwd, text=" x", spec=SpecStats(6, 12, 5, hist), ids=(9, 10))


@pytest.mark.parametrize("model", sorted(DIALECT_MODELS))
def test_perf_metrics_are_upstreams_names_dtypes_and_shapes(model):
    """return_perf_metrics: acceptance_rate, total_accepted_draft_tokens, total_draft_tokens as
    tensorrtllm_backend's models declare them (FP32 / INT32, dims [1], batch first), and our
    histogram beside them; every output sent has the dtype and rank its config.pbtxt declares."""
    kind, _, outputs = DIALECT_MODELS[model]
    declared = {t.name: t for t in outputs}
    # as tensorrtllm_backend's ensemble, tensorrt_llm_bls and tensorrt_llm config.pbtxt declare them
    # (all_models/inflight_batcher_llm/, read at the parent of commit 6a749f5, the last with all_models/)
    for name, dtype in (("acceptance_rate", mc.TYPE_FP32), ("total_accepted_draft_tokens", mc.TYPE_INT32),
                        ("total_draft_tokens", mc.TYPE_INT32)):
        assert (declared[name].dtype, declared[name].dims) == (dtype, (1,)), name
    inputs = (text() if kind == "text" else {"input_ids": np.array([[5, 6]], np.int32),
                                             "input_lengths": one(2, np.int32), "request_output_len": one(4, np.int32)})
    fwd = to_dflash(kind, {**inputs, "return_perf_metrics": one(True, bool)})
    assert "acceptance_histogram" in fwd.dflash_outputs  # asked of the dflash model
    out = to_dialect(fwd, perf_response(fwd))
    assert {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "acceptance_histogram",
            "rounds"} <= set(out)
    for name, arr in out.items():
        if name == "text_output":  # [beams]: upstream's postprocessing OUTPUT, not batch-first (test below)
            continue
        t = declared[name]
        assert arr.dtype == DTYPES[t.dtype] and arr.ndim == 1 + len(t.dims), name
        assert all(d == -1 or d == n for d, n in zip(t.dims, arr.shape[1:])) and arr.shape[0] == 1, name
    assert out["acceptance_rate"].tolist() == [[pytest.approx(5 / 12)]]
    assert out["total_accepted_draft_tokens"].tolist() == [[5]] and out["total_draft_tokens"].tolist() == [[12]]
    assert out["acceptance_histogram"].tolist() == [[3, 1, 2, 0]]


def test_every_declared_output_is_in_the_table_the_models_pick_outputs_from():
    """serve/dialect_outputs.py OUTPUTS_AS covers exactly the outputs the three models declare (the
    migration doc's output table is it), and a request naming no outputs gets what it says: the
    kind's own and every "always" output, plus those its return_* flags ask for, never a "never"."""
    from trtllm_dflash.serve.dialect_outputs import OUTPUTS_AS

    declared = {t.name for _, _, outputs in DIALECT_MODELS.values() for t in outputs}
    assert set(OUTPUTS_AS) == declared
    always = {n for n, (sent, _) in OUTPUTS_AS.items() if sent == "always"}
    plain = to_dflash("text", text())
    assert set(plain.outputs) == always | {"text_output", "batch_index"}
    flagged = to_dflash("ids", {"input_ids": np.array([[5, 6]], np.int32), "input_lengths": one(2, np.int32),
                                "request_output_len": one(4, np.int32), "return_perf_metrics": one(True, bool),
                                "return_num_input_tokens": one(True, bool)})
    assert set(flagged.outputs) == always | {"output_ids", "sequence_length", "num_input_tokens", "acceptance_rate",
                                             "acceptance_histogram", "arrival_time_ns", "first_token_time_ns",
                                             "last_token_time_ns", "batch_index"}
    assert not {n for n, (sent, _) in OUTPUTS_AS.items() if sent == "never"} & set(flagged.outputs)


def test_a_batch_of_prompts_is_one_forward_each_answered_with_its_batch_index():
    """README: `end_to_end_grpc_client.py --batch-inputs` sends 3 prompts in one request."""
    inputs = {"text_input": np.array([[b"a"], [b"bb"], [b"c"]], object), "max_tokens": np.full((3, 1), 5, np.int32),
              "stream": np.zeros((3, 1), bool), "temperature": np.ones((3, 1), np.float32)}
    fwds = to_dflash_batch("text", inputs, ["text_output", "batch_index"])
    assert [parse_request(f.inputs).prompt for f in fwds] == ["a", "bb", "c"]
    out = to_dialect(fwds[1], dflash_response(fwds[1]))
    assert out["text_output"].tolist() == [b"bbxy"]  # [beams]: the postprocessing model's OUTPUT, prompt first
    assert out["batch_index"].tolist() == [[1]] and out["batch_index"].dtype == np.int32
    (solo,) = to_dflash_batch("text", text(), ["text_output", "batch_index"])
    assert "batch_index" not in to_dialect(solo, dflash_response(solo))  # upstream sends it only for B > 1


def test_outputs_have_upstreams_shapes_and_log_probs():
    (fwd,) = to_dflash_batch("ids", {"input_ids": np.array([[5, 6]], np.int32), "input_lengths": one(2, np.int32),
                                     "request_output_len": one(4, np.int32), "streaming": one(True, bool),
                                     "return_log_probs": one(True, bool)})
    assert {"output_log_probs", "cum_log_probs"} <= set(fwd.dflash_outputs) and "batch_index" in fwd.outputs
    out = to_dialect(fwd, dflash_response(fwd, lps=(-0.5, -1.0), cum=-1.5))
    assert out["output_ids"].shape == (1, 1, 2)
    assert out["output_ids"].dtype == np.int32 and out["sequence_length"].shape == (1, 1)
    assert out["output_log_probs"].tolist() == [[[-0.5, -1.0]]] and out["cum_log_probs"].tolist() == [[-1.5]]
    assert "batch_index" not in out


def test_the_end_token_is_left_out_and_stop_words_lists_pass_through():
    words = np.array([[[3, 9, 2, 0], [3, -1, -1, -1]]], np.int32)  # one stop sequence: [3, 9, 2]
    fwd = to_dflash("ids", {"input_ids": np.array([[5, 6]], np.int32), "request_output_len": one(8, np.int32),
                            "stop_words_list": words})
    req = parse_request(fwd.inputs)
    assert req.skip_end_token and req.stop_ids == [[3, 9, 2]]


def test_text_stop_and_bad_words_become_token_level_words():
    fwd = to_dflash("text", text(stop_words=np.array([[b"ab", b""]], object), bad_words=np.array([[b"x"]], object)))
    req = parse_request(fwd.inputs)
    assert (req.stop_sequences, req.bad_words, req.stop_words) == (["ab"], ["x"], [])
    fwd = to_dflash("ids", {"input_ids": np.array([[5]], np.int32), "request_output_len": one(2, np.int32),
                            "bad_words_list": np.array([[[0], [-1]]], np.int32)})  # upstream's "no words"
    assert "bad_words_list" not in fwd.inputs


def test_log_probs_only_for_a_request_that_asked():
    """A client that names no output is asked every declared one (Triton): log-probs still go
    only to return_log_probs requests, as upstream's tensorrt_llm model sends them."""
    (fwd,) = to_dflash_batch("text", text(), ["text_output", "output_log_probs", "cum_log_probs"])
    assert set(to_dialect(fwd, dflash_response(fwd))) == {"text_output"}
