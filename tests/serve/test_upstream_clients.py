"""tensorrtllm_backend's own client scripts, unmodified, from a checkout the user names
($TRTLLM_DFLASH_TENSORRTLLM_BACKEND: a clone of triton-inference-server/tensorrtllm_backend, e.g.
tag v0.19.0, or of NVIDIA/TensorRT-LLM, whose triton_backend/ holds the same scripts; skipped
without it), run as subprocesses against `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm` of ONE
served deployment (the tiny pair on nvidia-pytriton's CPU tritonserver). The repository carries
none of upstream's code (docs/migrate-from-tensorrtllm-backend.md); what these cases send and how
the scripts check the replies is recorded as data (client_wire.yaml) and run without a checkout
by test_client_wire.py, which fails when a case of this file's CASES is not recorded.

Each case uses the flags the scripts and tensorrtllm_backend's README document, and checks the
answer with the script's own checker (`--check-outputs --expected-outputs` of
end_to_end_grpc_client.py, `--check-output --output-tokens-csv` of inflight_batcher_llm_client.py)
against the reference decoder's greedy output, masked by the bad words, ended by the stop word
(kept) or before the end token, as TensorRT-LLM answers. Beam width 2 is refused by name, and the
server answers afterwards.

inflight_batcher_llm_client.py without --streaming sends a plain ModelInfer, which Triton refuses
for any decoupled model (upstream's tensorrt_llm with decoupled_mode too); its offline case here
is `-n 1`, which the script sends on the streaming API with streaming false.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from serve_helpers import loaded_pair

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
pytest.importorskip("tritonclient.grpc")

CHECKOUT_VAR = "TRTLLM_DFLASH_TENSORRTLLM_BACKEND"


def client_dir() -> Path | None:
    """inflight_batcher_llm/client of the named checkout (tensorrtllm_backend's layout, or
    TensorRT-LLM's triton_backend/), None when the variable is unset."""
    root = os.environ.get(CHECKOUT_VAR)
    if not root:
        return None
    for sub in ("inflight_batcher_llm/client", "triton_backend/inflight_batcher_llm/client"):
        if (Path(root) / sub / "end_to_end_grpc_client.py").is_file():
            return Path(root) / sub
    raise pytest.UsageError(f"{CHECKOUT_VAR}={root}: no inflight_batcher_llm/client/end_to_end_grpc_client.py there "
                            "(a tensorrtllm_backend or TensorRT-LLM checkout)")


CLIENTS = client_dir()
if CLIENTS is None:
    pytest.skip(f"tensorrtllm_backend's client scripts run from a checkout: set {CHECKOUT_VAR} to a clone of "
                "triton-inference-server/tensorrtllm_backend (docs/migrate-from-tensorrtllm-backend.md)",
                allow_module_level=True)
PROMPT = "def area(r):\n    return"
BATCH = ["This is a test", "I want you to", "The cat is"]  # the README's --batch-inputs example
TEXT_MODELS = ("ensemble", "tensorrt_llm_bls")
N = 10


def greedy(pair, ids, n, bad=None, end=None, stop=None):
    """The reference's greedy output as the dialect returns it: bad words masked, the end token
    (end, else eos) left out, cut after the stop sequence."""
    from trtllm_dflash.reference import generate

    _, target, drafter = pair
    (g,) = generate(target, drafter, [ids], n, stop_token_ids=None if end is None else [end], bad_words=bad)
    out = g.tokens[:-1] if g.finish_reason == "stop" else g.tokens
    hit = next((i for i in range(len(out)) if stop and out[i : i + len(stop)] == stop), None)
    return out if hit is None else out[: hit + len(stop)]


def word(tok, ids, skip=()):
    """A token of `ids` that is a word of its own: its text tokenizes back to it alone."""
    for t in ids:
        text = tok.decode([t])
        if (t not in skip and text.strip() and "\ufffd" not in text
                and tok.encode(text, add_special_tokens=False) == [t]):
            return t, text
    raise AssertionError(f"no round-tripping token in {ids}")


def e2e(url, model, *args):
    return [sys.executable, str(CLIENTS / "end_to_end_grpc_client.py"), "-u", url, "--model-name", model, *args]


def ifb(url, *args):
    return [sys.executable, str(CLIENTS / "inflight_batcher_llm_client.py"), "-u", url, *args]


def checked(expected):
    return ["--check-outputs", "--expected-outputs", json.dumps(expected)]


def refused(rc, out):
    """The script printed our refusal and exited (a hung script is no answer)."""
    return rc is not None and "beam_width: 2 is not supported" in out and "Received an error from server" in out


def text_cases(url, pair, ids):
    """{name: (argv, check(rc, output))} of end_to_end_grpc_client.py for each text model."""
    tok = pair[0]
    plain = greedy(pair, ids, N)
    bad_id, bad = word(tok, plain[1:8])
    masked = greedy(pair, ids, 12, bad=[[bad_id]])
    stop_id, stop = word(tok, masked[3:], skip={bad_id})
    end_id, _ = word(tok, plain[3:])
    stopped = greedy(pair, ids, 12, [[bad_id]], stop=[stop_id])
    assert masked[: len(plain)] != plain and len(stopped) < len(masked) and greedy(pair, ids, N, end=end_id) != plain
    text = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
    batch = [text(greedy(pair, tok(p)["input_ids"], 5)) for p in BATCH]
    logprobs = f"output_log_probs.shape: (1, 1, {len(plain)})"
    ok = lambda rc, out: rc == 0 and "Received an error" not in out  # noqa: E731
    cases = {}
    for m in TEXT_MODELS:
        cases.update({
            f"{m} streaming": (e2e(url, m, "-S", "-o", str(N), "-p", PROMPT, *checked([text(plain)])), ok),
            f"{m} offline, log-probs": (e2e(url, m, "-o", str(N), "-p", PROMPT, "--return-log-probs",
                                            *checked([text(plain)])), lambda rc, out: ok(rc, out) and logprobs in out),
            f"{m} batch inputs": (e2e(url, m, "-o", "5", "-p", json.dumps(BATCH), "--batch-inputs", *checked(batch)),
                                  ok),
            f"{m} stop and bad words": (e2e(url, m, "-o", "12", "-p", PROMPT, "--stop-words", stop, "--bad-words", bad,
                                            *checked([text(stopped)])), ok),
            f"{m} end and pad ids": (e2e(url, m, "-o", str(N), "-p", PROMPT, "--end-id", str(end_id), "--pad-id", "0",
                                         *checked([text(greedy(pair, ids, N, end=end_id))])), ok),
            f"{m} exclude input": (e2e(url, m, "-o", str(N), "-p", PROMPT, "--exclude-input-in-output",
                                       *checked([text(plain)])), ok),
            f"{m} beam width 2": (e2e(url, m, "-o", "4", "-p", PROMPT, "-b", "2"), refused),
        })
    return cases


def ids_cases(url, pair, ids, tmp: Path, tokenizer_dir):
    """{name: (argv, check)} of inflight_batcher_llm_client.py against tensorrt_llm."""
    plain = greedy(pair, ids, N)
    end_id, _ = word(pair[0], plain[3:])

    def csv(name, values):
        (tmp / name).write_text(",".join(map(str, values)) + "\n")
        return str(tmp / name)

    passed = lambda rc, out: rc == 0 and "PASS!" in out  # noqa: E731
    common = ["--tokenizer-dir", str(tokenizer_dir), "--text", PROMPT, "--request-output-len", str(N), "--check-output"]
    return {
        "tensorrt_llm streaming, log-probs": (
            ifb(url, "-S", *common, "--return-log-probs", "--output-tokens-csv", csv("out.csv", ids + plain)),
            lambda rc, out: passed(rc, out) and "cum_log_probs:" in out),
        "tensorrt_llm offline (-n 1)": (ifb(url, "-n", "1", *common, "--output-tokens-csv",
                                            csv("out1.csv", ids + plain)),
                                        passed),
        "tensorrt_llm end and pad ids, exclude input": (
            ifb(url, "-S", "--input-tokens-csv", csv("in.csv", ids), "--end-id", str(end_id), "--pad-id", "7",
                "--request-output-len", str(N), "--exclude-input-in-output", "--check-output",
                "--output-tokens-csv", csv("out2.csv", greedy(pair, ids, N, end=end_id)))
            , passed),
        "tensorrt_llm beam width 2": (ifb(url, "-S", *common[:-1], "-b", "2"),
                                      lambda rc, out: rc not in (0, None) and "beam_width: 2 is not supported" in out),
    }


CLIENT_TIMEOUT_S = 180


def run(argv):
    """(exit code, output) of one client script; a script that hangs fails its own case (exit code
    None, with what it printed), not the whole module's fixture."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = "".join(x.decode() if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        return None, f"{out}\n(timed out after {CLIENT_TIMEOUT_S} s)"
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory, default_served):
    """Every case's (check, return code, output), the cases run together on one server; then one
    more request, after the refusals."""
    root = tmp_path_factory.mktemp("upstream_clients")
    recipe, _ = default_served
    url = f"127.0.0.1:{recipe.serve.grpc_port}"
    pair = loaded_pair(recipe.target.path, recipe.drafter.path)
    ids = pair[0](PROMPT)["input_ids"]
    cases = {**text_cases(url, pair, ids), **ids_cases(url, pair, ids, root, recipe.target.path)}
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(cases, pool.map(run, [argv for argv, _ in cases.values()])))
    after = run(cases["ensemble streaming"][0])
    return {name: (cases[name][1], *done[name]) for name in cases} | {"served after": (cases["ensemble streaming"][1],
                                                                                      *after)}


CASES = [f"{m} {c}" for m in TEXT_MODELS for c in ("streaming", "offline, log-probs", "batch inputs",
                                                    "stop and bad words", "end and pad ids", "exclude input",
                                                    "beam width 2")] + [
    "tensorrt_llm streaming, log-probs", "tensorrt_llm offline (-n 1)", "tensorrt_llm end and pad ids, exclude input",
    "tensorrt_llm beam width 2", "served after"]


@pytest.mark.parametrize("case", CASES)
def test_upstream_client_script(results, case):
    check, rc, out = results[case]
    assert check(rc, out), f"{case}: exit {rc}\n{out[-3000:]}"
