"""What tensorrtllm_backend's client scripts send and read, without the scripts: every request
test_upstream_clients.py runs them with (end_to_end_grpc_client.py against `ensemble` and
`tensorrt_llm_bls`, inflight_batcher_llm_client.py against `tensorrt_llm`, v0.19.0), rebuilt
with tritonclient from the wire facts recorded in client_wire.yaml, sent on the gRPC streaming API
the scripts use to ONE served deployment (the tiny pair on nvidia-pytriton's CPU tritonserver),
and checked as the script's own output check does against the reference decoder's greedy output:
bad words masked, ended before the end token, cut after the stop word (kept), as TensorRT-LLM
answers. Beam width 2 is refused by name, and the server answers afterwards.

The scripts themselves run there, from a checkout the user names. Here the streams carry a
deadline (STREAM_TIMEOUT_S), which the scripts do not set: a hung stream fails its case instead
of the run.
"""

import ast
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from serve_helpers import loaded_pair

WIRE = yaml.safe_load(Path(__file__).with_name("client_wire.yaml").read_text())
SCRIPTS, CASES = WIRE["scripts"], WIRE["cases"]
TEXT_SCRIPT = "end_to_end_grpc_client.py"
STREAM_TIMEOUT_S = 120
DTYPES = {"BYTES": object, "BOOL": bool, "INT32": np.int32, "FP32": np.float32}

# The cases the scripts are run with (test_upstream_clients.py's CASES, those of the script test
# before upstream's files left the repository): the data must keep every one.
SCRIPT_CASES = [
    *(f"{m} {c}" for m in ("ensemble", "tensorrt_llm_bls")
      for c in ("streaming", "offline, log-probs", "batch inputs", "stop and bad words", "end and pad ids",
                "exclude input", "beam width 2")),
    "tensorrt_llm streaming, log-probs", "tensorrt_llm offline (-n 1)", "tensorrt_llm end and pad ids, exclude input",
    "tensorrt_llm beam width 2", "served after",
]


def named_cases() -> dict[str, tuple[str, dict]]:
    """{"<model> <case>": (model, case)}: a case runs on each model of its script."""
    return {f"{m} {c['name']}": (m, c) for c in CASES for m in SCRIPTS[c["script"]]["models"]}


def resolve(value, sym: dict):
    if isinstance(value, list):
        return [resolve(v, sym) for v in value]
    return sym[value[1:]] if isinstance(value, str) and value.startswith("$") else value


def array(spec: dict, sym: dict) -> np.ndarray:
    """The input as the script builds it: its value in the recorded shape (a scalar fills it)."""
    value, dtype = resolve(spec["value"], sym), DTYPES[spec["datatype"]]
    shape = [-1 if d == "L" else d for d in spec["shape"]]
    if isinstance(value, list):
        return np.array(value, dtype=dtype).reshape(shape)
    return np.full(shape, value, dtype=dtype)


def flag(case, name) -> bool:
    return name in case["flags"]


# --- the reference's answers -------------------------------------------------------------------


def greedy(pair, ids, n, bad=None, end=None, stops=()):
    """The reference's greedy output as the dialect returns it: bad words masked, the end token
    (end, else eos) left out, cut after the first stop sequence."""
    return list(_greedy(pair, tuple(ids), n, tuple(map(tuple, bad or ())), end, tuple(map(tuple, stops))))


@functools.lru_cache(maxsize=64)
def _greedy(pair, ids, n, bad, end, stops):
    from trtllm_dflash.reference import generate

    _, target, drafter = pair
    (g,) = generate(target, drafter, [list(ids)], n, stop_token_ids=None if end is None else [end],
                    bad_words=[list(b) for b in bad] or None)
    out = g.tokens[:-1] if g.finish_reason == "stop" else g.tokens
    hits = [i + len(s) for s in stops for i in range(len(out)) if out[i : i + len(s)] == list(s)]
    return tuple(out[: min(hits)] if hits else out)


def word(tok, ids, skip=()):
    """A token of `ids` that is a word of its own: its text tokenizes back to it alone."""
    for t in ids:
        text = tok.decode([t])
        alone = tok.encode(text, add_special_tokens=False) == [t]
        if t not in skip and text.strip() and "\ufffd" not in text and alone:
            return t, text
    raise AssertionError(f"no round-tripping token in {ids}")


def symbols(pair) -> dict:
    """The values the data names by `$name` (client_wire.yaml `symbols`)."""
    tok = pair[0]
    ids = tok(WIRE["symbols"]["prompt"]["value"])["input_ids"]
    plain = greedy(pair, ids, 10)
    bad_id, bad = word(tok, plain[1:8])
    _, stop = word(tok, greedy(pair, ids, 12, bad=[[bad_id]])[3:], skip={bad_id})
    end_id, _ = word(tok, plain[3:])
    first = lambda text: tok.encode(text, add_special_tokens=False)[0]  # noqa: E731
    return {"prompt": WIRE["symbols"]["prompt"]["value"], "prompt_ids": ids, "prompt_len": len(ids),
            "bad_word": bad, "stop_word": stop, "end_word_id": end_id, "tokenizer_eos_id": first(tok.eos_token),
            "tokenizer_pad_id": first(tok.pad_token or tok.eos_token)}


def reference(pair, spec: dict, sym: dict) -> list[int]:
    """The greedy output of one `expected` spec."""
    tok = pair[0]
    words = [tok.encode(w, add_special_tokens=False) for w in resolve(spec.get("bad_words", []), sym)]
    stops = [tok.encode(w, add_special_tokens=False) for w in resolve(spec.get("stop_words", []), sym)]
    return greedy(pair, tok(resolve(spec["prompt"], sym))["input_ids"], spec["max_tokens"], words or None,
                  resolve(spec.get("end_id"), sym), stops)


# --- the request, on the wire ------------------------------------------------------------------


def send(url: str, model: str, case: dict, sym: dict) -> list:
    """Every callback of one request on the streaming API, as the scripts send it: start_stream,
    async_stream_infer, stop_stream (which waits for the server to close the stream)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for spec in case["inputs"]:
        arr = array(spec, sym)
        inputs.append(grpcclient.InferInput(spec["name"], list(arr.shape), np_to_triton_dtype(arr.dtype)))
        inputs[-1].set_data_from_numpy(arr)
    outputs = [grpcclient.InferRequestedOutput(n) for n in case["outputs"]] or None
    got = []
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: got.append(error or result), stream_timeout=STREAM_TIMEOUT_S)
        client.async_stream_infer(model, inputs, outputs=outputs, request_id=SCRIPTS[case["script"]]["request_id"])
        client.stop_stream()
    finally:
        client.close()
    return got


# --- the scripts' own checks -------------------------------------------------------------------


def errors(replies) -> list[str]:
    from tritonclient.utils import InferenceServerException

    return [str(r) for r in replies if isinstance(r, InferenceServerException)]


def texts(case: dict, replies, sym) -> list[str]:
    """end_to_end_grpc_client.py's texts, by batch and sequence index: streamed with one beam each
    response's text_output[0] is appended, otherwise it replaces."""
    first = array(case["inputs"][0], sym)
    beams = int(array(next(i for i in case["inputs"] if i["name"] == "beam_width"), sym)[0, 0])
    out = [[""] * beams for _ in range(first.shape[0])]
    for r in replies:
        b, s = (0 if r.as_numpy(n) is None else int(r.as_numpy(n)[0][0]) for n in ("batch_index", "sequence_index"))
        text = r.as_numpy("text_output")[0].decode("utf-8")
        out[b][s] = out[b][s] + text if flag(case, "-S") and beams == 1 else text
    return [t for batch in out for t in batch]


def text_problem(case: dict, replies, pair, sym) -> str | None:
    """--check-outputs (lines 729-741): each prompt's texts equal its expected text, the prompt put
    before it unless streamed or excluded; printed_shapes as the script prints them."""
    if errors(replies):
        return f"Received an error from server: {errors(replies)}"
    prompts = resolve(case["inputs"][0]["value"], sym)
    prompts = prompts if isinstance(prompts, list) else [prompts]
    got = texts(case, replies, sym)
    want = [pair[0].decode(reference(pair, spec, sym), skip_special_tokens=True) for spec in case["expected"]]
    if not (flag(case, "-S") or flag(case, "--exclude-input-in-output")):
        want = [p + w for p, w in zip(prompts, want)]
    if got != want:
        return f"texts {got!r} != expected {want!r}"
    generated = len(reference(pair, case["expected"][0], sym))
    for name, shape in case.get("printed_shapes", {}).items():
        printed = {r.as_numpy(name).shape for r in replies if r.as_numpy(name) is not None}
        if printed != {tuple(generated if d == "$generated" else d for d in shape)}:
            return f"{name}.shape printed {printed}, not {shape} ({generated} tokens)"
    return None


def output_ids(case: dict, replies, sym) -> list[int]:
    """inflight_batcher_llm_client.py's ids of sequence 0: streamed they start as input_ids (none
    when excluded) and each response with a sequence_length > 0 appends output_ids[0][0]; not
    streamed each response extends them, cut to the last sequence_length."""
    streaming = flag(case, "-S")
    ids = [] if flag(case, "--exclude-input-in-output") or not streaming else array(case["inputs"][0], sym)[0].tolist()
    seq_len = 0
    for r in replies:
        if r.as_numpy("output_ids") is None:
            continue
        assert r.as_numpy("sequence_index") is None or r.as_numpy("sequence_index")[0][0] == 0
        if case.get("log_probs"):  # the script reads [0] of both
            assert r.as_numpy("cum_log_probs") is not None and r.as_numpy("output_log_probs") is not None
        seq_len = int(r.as_numpy("sequence_length")[0][0])
        if seq_len > 0 or not streaming:
            ids += r.as_numpy("output_ids")[0][0].tolist()
    return ids if streaming else ids[:seq_len]


def ids_problem(case: dict, replies, pair, sym) -> str | None:
    """--check-output (lines 1101-1146): the ids equal --output-tokens-csv's row, else FAIL!."""
    if errors(replies):
        return f"Received an error from server: {errors(replies)}"
    want = [t for part in case["expected_ids"]
            for t in (reference(pair, part, sym) if isinstance(part, dict) else resolve(part, sym))]
    got = output_ids(case, replies, sym)
    return None if got == want else f"FAIL!: output ids {got} != expected {want}"


def problem(case: dict, replies, pair, sym) -> str | None:
    """What the script's own check would report of these replies, None when it passes."""
    if "refused" in case:
        found = errors(replies)
        return None if any(case["refused"] in e for e in found) else f"not refused with {case['refused']!r}: {found}"
    return (text_problem if case["script"] == TEXT_SCRIPT else ids_problem)(case, replies, pair, sym)


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wire(default_served):
    """(pair, symbols, {case name: (case, replies)}): every case sent at once to one server, then
    `served_after` once more, after the refusals."""
    pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
    pytest.importorskip("tritonclient.grpc")
    recipe, server = default_served
    pair = loaded_pair(recipe.target.path, recipe.drafter.path)
    sym, url, cases = symbols(pair), server.endpoints.grpc_url, named_cases()
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {name: pool.submit(send, url, model, case, sym) for name, (model, case) in cases.items()}
        replies = {name: (cases[name][1], f.result()) for name, f in futures.items()}
    after_model, after_case = cases[WIRE["served_after"]]
    return pair, sym, replies | {"served after": (after_case, send(url, after_model, after_case, sym))}


@pytest.mark.parametrize("name", SCRIPT_CASES)
def test_recorded_request_passes_the_scripts_check(wire, name):
    pair, sym, replies = wire
    case, got = replies[name]
    found = problem(case, got, pair, sym)
    assert found is None, f"{name}: {found}"


def test_the_picked_words_change_the_reference_output(wire):
    """The stop, bad and end words cases could pass on an ignored input otherwise."""
    pair, sym, _ = wire
    spec = {"prompt": "$prompt", "max_tokens": 12}
    plain, masked = reference(pair, spec, sym), reference(pair, {**spec, "bad_words": ["$bad_word"]}, sym)
    assert masked != plain
    assert len(reference(pair, {**spec, "bad_words": ["$bad_word"], "stop_words": ["$stop_word"]}, sym)) < len(masked)
    assert reference(pair, {**spec, "end_id": "$end_word_id"}, sym) != plain


def script_test_cases() -> list[str]:
    """test_upstream_clients.py's CASES, read without importing it (it skips without a checkout)."""
    tree, names = ast.parse(Path(__file__).with_name("test_upstream_clients.py").read_text()), {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in ("TEXT_MODELS", "CASES"):
            names[node.targets[0].id] = eval(compile(ast.Expression(node.value), "test_upstream_clients.py", "eval"),
                                             dict(names))
    return names["CASES"]


def test_the_data_keeps_every_case_the_scripts_run():
    assert sorted([*named_cases(), "served after"]) == sorted(SCRIPT_CASES) == sorted(script_test_cases())
    assert WIRE["served_after"] in named_cases()
    assert set(WIRE["symbols"]) == set(FAKE_SYMBOLS) | {"generated"}
    assert all(s["path"].endswith(name) and all(i["lines"] for i in s["inputs"]) for name, s in SCRIPTS.items())


FAKE_SYMBOLS = {"prompt": "p", "prompt_ids": [5, 6], "prompt_len": 2, "bad_word": "b", "stop_word": "s",
                "end_word_id": 9, "tokenizer_eos_id": 0, "tokenizer_pad_id": 0}


@pytest.mark.parametrize("name", list(named_cases()))
def test_each_case_sends_what_its_script_sends(name):
    """A case's inputs are its script's, in its order, with their datatypes (the one the scripts'
    prepare_tensor gives the array) and the values its flags give; every input the script always
    sends is there; its outputs are ones the script asks for."""
    np_to_triton_dtype = pytest.importorskip("tritonclient.utils").np_to_triton_dtype
    _, case = named_cases()[name]
    declared = {i["name"]: i for i in SCRIPTS[case["script"]]["inputs"]}
    sent = [i["name"] for i in case["inputs"]]
    assert set(sent) <= set(declared) and sent == [n for n in declared if n in sent]
    assert {n for n, i in declared.items() if i["when"] == "always"} <= set(sent)
    assert set(case["outputs"]) <= {o["name"] for o in SCRIPTS[case["script"]]["outputs_requested"]}
    assert sum(k in case for k in ("expected", "expected_ids", "refused")) == 1
    for spec in case["inputs"]:
        arr = array(spec, FAKE_SYMBOLS)
        assert arr.ndim == 2 and arr.shape[0] == case["inputs"][0]["shape"][0], spec
        assert spec["datatype"] == declared[spec["name"]]["datatype"] == np_to_triton_dtype(arr.dtype), spec
        if "flag" in declared[spec["name"]]:
            assert str(spec["value"]) == str(flag_value(case, declared[spec["name"]])), f"{spec}: {case['flags']}"


def flag_value(case: dict, declared: dict):
    """What the script puts in an input from the case's flags: a switch is whether it is given, a
    valued flag the argument after it, else the flag's default."""
    argv, name = case["flags"], declared["flag"]
    if declared.get("switch"):
        return name in argv
    return type(declared.get("default", ""))(argv[argv.index(name) + 1]) if name in argv else declared.get("default")


class FakeResult:
    """InferResult's as_numpy, all the checks call."""

    def __init__(self, **outputs):
        self.outputs = {k: np.array(v) for k, v in outputs.items()}

    def as_numpy(self, name):
        return self.outputs.get(name)


def test_the_checks_read_replies_as_the_scripts_do():
    """Streamed texts append, others replace; streamed ids follow the prompt's, offline ones are cut
    to sequence_length; missing log-probs, other ids, an error and a missing refusal fail."""
    pytest.importorskip("tritonclient.utils")
    sym, cases = FAKE_SYMBOLS, named_cases()
    two = [FakeResult(text_output=[b"ab"]), FakeResult(text_output=[b"c"])]
    assert texts(cases["ensemble streaming"][1], two, sym) == ["abc"]
    assert texts(cases["ensemble exclude input"][1], two, sym) == ["c"]
    streamed = cases["tensorrt_llm streaming, log-probs"][1]
    reply = FakeResult(output_ids=[[[8, 9]]], sequence_length=[[2]], cum_log_probs=[[0.0]], output_log_probs=[[[0, 0]]])
    assert output_ids(streamed, [reply], sym) == [5, 6, 8, 9]
    assert ids_problem(dict(streamed, expected_ids=["$prompt_ids", [8, 9]]), [reply], None, sym) is None
    assert "FAIL!" in ids_problem(dict(streamed, expected_ids=["$prompt_ids", [8]]), [reply], None, sym)
    with pytest.raises(AssertionError):  # no log-probs: the script fails reading them
        output_ids(streamed, [FakeResult(output_ids=[[[8]]], sequence_length=[[1]])], sym)
    offline = cases["tensorrt_llm offline (-n 1)"][1]
    assert output_ids(offline, [FakeResult(output_ids=[[[5, 6, 8, 0]]], sequence_length=[[3]])], sym) == [5, 6, 8]
    from tritonclient.utils import InferenceServerException

    refusal = InferenceServerException("beam_width: 2 is not supported")
    assert "error" in ids_problem(streamed, [refusal], None, sym)
    assert problem(cases["tensorrt_llm beam width 2"][1], [refusal], None, sym) is None
    assert problem(cases["tensorrt_llm beam width 2"][1], [reply], None, sym) is not None
