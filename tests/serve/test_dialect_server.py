"""tensorrtllm_backend's dialect end to end: `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm` on
one real tritonserver (nvidia-pytriton's, CPU), forwarding to the deployed `dflash` model.

Requests are shaped like TensorRT-LLM's clients send them (triton_backend/inflight_batcher_llm/
client/end_to_end_grpc_client.py and inflight_batcher_llm_client.py: batch-first [1, 1] tensors,
gRPC streaming), and answers are compared with the reference's greedy output, which is what
`trtllm-dflash generate` prints.
"""

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from serve_helpers import loaded_pair

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
grpcclient = pytest.importorskip("tritonclient.grpc.aio")


PROMPT = "def area(r):\n    return"
STREAM_TIMEOUT_S = 120  # a stream that takes longer hangs: fail it rather than the whole run


@pytest.fixture(scope="module")
def served(default_served):
    return default_served


def reference_ids(recipe, prompt_ids: list[int], max_tokens: int, stop=None) -> list[int]:
    from trtllm_dflash.reference import generate

    _, target, drafter = loaded_pair(recipe.target.path, recipe.drafter.path)
    out = generate(target, drafter, [prompt_ids], max_tokens, block_size=recipe.speculative.block_size,
                   **({"stop_token_ids": [stop]} if stop is not None else {}))
    return out[0].tokens


def tokenizer(recipe):
    return loaded_pair(recipe.target.path, recipe.drafter.path)[0]


def reference_text(recipe, prompt: str, max_tokens: int) -> str:
    tok = tokenizer(recipe)
    return tok.decode(reference_ids(recipe, tok(prompt)["input_ids"], max_tokens))


def batch_first(name, value, dtype):
    """One [1, 1] (or [1, N] for a list) input, as upstream's clients build them."""
    arr = np.array([value if isinstance(value, list) else [value]], dtype=object if dtype == "BYTES" else None)
    t = grpcclient.InferInput(name, list(arr.shape), dtype)
    t.set_data_from_numpy(arr)
    return t


def text_request(prompt=PROMPT, max_tokens=16, stream=True, **extra):
    inputs = [batch_first("text_input", prompt.encode(), "BYTES"),
              batch_first("max_tokens", np.int32(max_tokens), "INT32"), batch_first("stream", stream, "BOOL")]
    return inputs + [batch_first(name, value, dtype) for name, (value, dtype) in extra.items()]


async def _stream(url, model, inputs, outputs=None):
    """(responses as {name: array}, error) of one streamed request; ends at the final response."""
    client = grpcclient.InferenceServerClient(url)

    async def requests():
        req = {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}
        if outputs:
            req["outputs"] = [grpcclient.InferRequestedOutput(n) for n in outputs]
        yield req

    got, error = [], None
    try:
        async for result, err in client.stream_infer(inputs_iterator=requests()):
            if err is not None:
                error = str(err)
                break
            resp = result.get_response()
            if resp.outputs:
                got.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
            if resp.parameters["triton_final_response"].bool_param:
                break
    finally:
        await asyncio.wait_for(client.close(), 30)  # a stuck channel fails the test instead of hanging the run
    return got, error


def stream(url, model, inputs, outputs=None):
    return asyncio.run(asyncio.wait_for(_stream(url, model, inputs, outputs), STREAM_TIMEOUT_S))


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_text_models_stream_the_reference_text(served, model):
    recipe, server = served
    got, error = stream(server.endpoints.grpc_url, model, text_request(exclude_input_in_output=(True, "BOOL")))
    assert error is None and len(got) > 1
    assert all(r["text_output"].shape == (1,) for r in got)  # [beams], as upstream's postprocessing OUTPUT
    assert "".join(r["text_output"][0].decode() for r in got) == reference_text(recipe, PROMPT, 16)
    last = got[-1]
    assert last["finish_reason"][0, 0] in (b"length", b"stop") and last["rounds"][0, 0] >= 1
    assert 0 <= last["total_accepted_draft_tokens"][0, 0] <= last["total_draft_tokens"][0, 0]


def test_non_streamed_text_includes_the_prompt_unless_excluded(served):
    recipe, server = served
    want = reference_text(recipe, PROMPT, 10)
    got, error = stream(server.endpoints.grpc_url, "ensemble", text_request(max_tokens=10, stream=False))
    assert error is None and len(got) == 1 and got[0]["text_output"][0].decode() == PROMPT + want
    got, error = stream(server.endpoints.grpc_url, "ensemble",
                        text_request(max_tokens=10, stream=False, exclude_input_in_output=(True, "BOOL")))
    assert error is None and got[0]["text_output"][0].decode() == want


def ids_request(ids, max_tokens=16, streaming=True, beam_width=1, **extra):
    inputs = [batch_first("input_ids", [np.int32(i) for i in ids], "INT32"),
              batch_first("input_lengths", np.int32(len(ids)), "INT32"),
              batch_first("request_output_len", np.int32(max_tokens), "INT32"),
              batch_first("streaming", streaming, "BOOL"), batch_first("beam_width", np.int32(beam_width), "INT32"),
              batch_first("temperature", np.float32(1.0), "FP32")]  # the client's default: greedy all the same
    return inputs + [batch_first(name, value, dtype) for name, (value, dtype) in extra.items()]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "offline"])
def test_token_model_answers_like_the_inflight_batcher_client_expects(served, streaming):
    """The inflight_batcher_llm client collects output_ids[0][0]: streamed, the new tokens of each
    response; offline, prompt and output (exclude_input_in_output unset); sequence_length[0][0]
    is their count."""
    recipe, server = served
    ids = tokenizer(recipe)(PROMPT)["input_ids"]
    want = reference_ids(recipe, ids, 12)
    got, error = stream(server.endpoints.grpc_url, "tensorrt_llm", ids_request(ids, 12, streaming),
                        outputs=["output_ids", "sequence_length"])
    assert error is None and got
    assert all(r["output_ids"].ndim == 3 and r["output_ids"].shape[:2] == (1, 1) for r in got)
    assert all(r["sequence_length"][0, 0] == r["output_ids"].shape[2] for r in got)
    tokens = [t for r in got for t in r["output_ids"][0][0].tolist()]
    assert tokens == (want if streaming else ids + want)


def test_end_id_ends_the_request_before_that_token(served):
    """The executor stops at end_id without returning it (NVIDIA/TensorRT-LLM#2190); so do we."""
    recipe, server = served
    ids = tokenizer(recipe)(PROMPT)["input_ids"]
    free = reference_ids(recipe, ids, 12)
    end = free[3]  # a token the greedy output reaches (the reference keeps it, the executor does not)
    want = reference_ids(recipe, ids, 12, stop=end)
    assert len(want) < len(free) and want[-1] == end
    got, error = stream(server.endpoints.grpc_url, "tensorrt_llm",
                        ids_request(ids, 12, end_id=(np.int32(end), "INT32"), pad_id=(np.int32(0), "INT32")))
    assert error is None and [t for r in got for t in r["output_ids"][0][0].tolist()] == want[:-1]


@pytest.mark.parametrize(
    "model,inputs,message",
    [
        ("ensemble", lambda ids: text_request(beam_width=(np.int32(2), "INT32")), "beam_width: 2 is not supported"),
        ("tensorrt_llm_bls", lambda ids: text_request(lora_task_id=(np.uint64(3), "UINT64")), "lora_task_id: LoRA"),
        ("tensorrt_llm", lambda ids: ids_request(ids, beam_width=2), "beam_width: 2 is not supported"),
        ("ensemble", lambda ids: text_request(repetition_penalty=(np.float32(1.3), "FP32")), "repetition_penalty"),
        ("ensemble", lambda ids: text_request(return_context_logits=(True, "BOOL")), "return_context_logits"),
        ("tensorrt_llm", lambda ids: ids_request([10 ** 6]), "input_ids: token id 1000000 is outside"),
    ],
)
def test_what_we_cannot_honour_is_refused_by_name_and_the_server_keeps_serving(served, model, inputs, message):
    recipe, server = served
    ids = tokenizer(recipe)(PROMPT)["input_ids"]
    _, error = stream(server.endpoints.grpc_url, model, inputs(ids))
    assert error is not None and message in error
    got, error = stream(server.endpoints.grpc_url, model, text_request(max_tokens=4) if model != "tensorrt_llm"
                        else ids_request(ids, 4))
    assert error is None and got


@pytest.mark.slow
def test_sweep_drives_the_ensemble_model(served, tmp_path):
    recipe, server = served
    cmd = [sys.executable, "-m", "trtllm_dflash", "sweep", str(recipe.file), "--url", server.endpoints.grpc_url,
           "--model", "ensemble", "--out", str(tmp_path), "--levels", "1,2", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert {lv["curve"] for lv in summary["levels"]} == {"ar", "dflash"}
    assert all(lv["failed"] == 0 and lv["output_tok_s_per_gpu"] > 0 for lv in summary["levels"])
    assert all((lv["tau"] == 1.0 and lv["draft_per_round"] == 0) == (lv["curve"] == "ar") for lv in summary["levels"])
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows and all(row["text"] for row in rows if not row["warmup"])


def test_a_cancelled_stream_stops_its_dflash_request(served):
    """The bundled Triton's BLS cannot cancel what it forwarded (no ResponseIterator.cancel before
    python_backend PR #398): the model stops it with a `stop` request to dflash instead.

    The request is as long as the deployment allows (480 of max_seq_len 512): a cancel that
    reaches the model after the last token has nothing to stop, so the decode must outlast a
    loaded machine's cancel (docs/results/suite-time.md)."""
    recipe, server = served

    async def cancel_after_first():
        client = grpcclient.InferenceServerClient(server.endpoints.grpc_url)

        async def requests():
            yield {"model_name": "ensemble", "inputs": text_request(max_tokens=480)}

        it = client.stream_infer(inputs_iterator=requests())
        async for _ in it:
            it.cancel()
            break
        await asyncio.wait_for(client.close(), 30)

    asyncio.run(asyncio.wait_for(cancel_after_first(), STREAM_TIMEOUT_S))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "dflash request stopped" not in server.log_path.read_text():
        time.sleep(0.2)
    assert "dflash request stopped" in server.log_path.read_text()
    got, error = stream(server.endpoints.grpc_url, "ensemble", text_request(max_tokens=6))
    assert error is None and got


def test_concurrent_requests_on_every_model_share_the_engine_and_stay_exact(served):
    recipe, server = served
    prompts = [f"def f{i}(x):\n    return x + {i}" for i in range(6)]
    tok = tokenizer(recipe)
    models = ["ensemble", "tensorrt_llm_bls", "tensorrt_llm"] * 2

    def inputs(model, prompt):
        if model == "tensorrt_llm":
            return ids_request(tok(prompt)["input_ids"], 12)
        return text_request(prompt, 12)

    async def many():
        url = server.endpoints.grpc_url
        return await asyncio.wait_for(asyncio.gather(*(_stream(url, m, inputs(m, p)) for m, p in zip(models, prompts))),
                                      STREAM_TIMEOUT_S)

    for model, prompt, (got, error) in zip(models, prompts, asyncio.run(many())):
        assert error is None
        if model == "tensorrt_llm":
            want = reference_ids(recipe, tok(prompt)["input_ids"], 12)
            assert [t for r in got for t in r["output_ids"][0][0].tolist()] == want
        else:
            assert "".join(r["text_output"][0].decode() for r in got) == reference_text(recipe, prompt, 12)


def stub_pids(server) -> dict[str, int]:
    """{model: pid} of `server`'s Python backend stubs, the children of its tritonserver (other
    test workers run servers of the same models); the model's name is in the stub's argv."""
    pids = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text()
        except OSError:  # not a process, or it ended
            continue
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        if argv[0].endswith(b"triton_python_backend_stub") and parent == server.proc.pid:
            pids[Path(argv[1].decode()).parent.parent.name] = int(proc.name)
    return pids


def test_the_forwarding_stubs_outlive_many_finished_streams(served):
    """The bundled stub (python_backend r24.10) freed a finished BLS iterator's tensors without
    the GIL when its own thread let the iterator go last: under Python 3.12 the `ensemble` stub
    segfaulted within a few dozen streams (python_backend PR #390; serve/dialect_model.py
    _Graveyard). 96 short streams, 8 at a time, must leave every stub alive and every answer whole."""
    recipe, server = served
    before = stub_pids(server)
    assert {"dflash", "ensemble", "tensorrt_llm_bls"} <= set(before)

    async def many():
        url, gate = server.endpoints.grpc_url, asyncio.Semaphore(8)

        async def one(i):
            async with gate:
                model = ("ensemble", "tensorrt_llm_bls")[i % 2]
                return await _stream(url, model, text_request(f"def g{i}(x):\n    return", 4))

        return await asyncio.gather(*(one(i) for i in range(96)))

    results = asyncio.run(asyncio.wait_for(many(), 60))  # about 1 s here; a dead stub hangs some
    assert [error for _, error in results if error is not None] == []
    assert all(got for got, _ in results)
    assert stub_pids(server) == before


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls", "tensorrt_llm"])
def test_return_perf_metrics_answers_upstreams_acceptance_names(served, model):
    """tensorrtllm_backend's flag on every dialect model: acceptance_rate FP32, total_accepted_draft_tokens
    and total_draft_tokens INT32, batch-first [1, 1] as upstream's models send them, with our
    histogram ([1, block_size] verify passes by drafts accepted) agreeing with them."""
    recipe, server = served
    flag = {"return_perf_metrics": (True, "BOOL")}
    if model == "tensorrt_llm":
        inputs = ids_request(tokenizer(recipe)(PROMPT)["input_ids"], 12, False)
        inputs.append(batch_first("return_perf_metrics", True, "BOOL"))
    else:
        inputs = text_request(max_tokens=12, stream=False, **flag)
    got, error = stream(server.endpoints.grpc_url, model, inputs)
    assert error is None and len(got) == 1
    out = got[0]
    assert (out["acceptance_rate"].dtype, out["acceptance_rate"].shape) == (np.float32, (1, 1))
    for name in ("total_accepted_draft_tokens", "total_draft_tokens"):
        assert (out[name].dtype, out[name].shape) == (np.int32, (1, 1)), name
    hist = out["acceptance_histogram"]
    assert hist.dtype == np.int32 and hist.shape == (1, recipe.speculative.block_size)
    accepted, drafted = int(out["total_accepted_draft_tokens"][0, 0]), int(out["total_draft_tokens"][0, 0])
    assert hist[0].sum() == out["rounds"][0, 0] and sum(j * n for j, n in enumerate(hist[0].tolist())) == accepted
    assert out["acceptance_rate"][0, 0] == pytest.approx(accepted / drafted if drafted else 0.0)
