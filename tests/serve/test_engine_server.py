"""The engine backend's deployment behind a real tritonserver on CPU: `serve --runners reference`
and `--runners emulated` run the very model file the GPU deployment runs (serve/triton_model.py),
over the checkpoint the (dry-run) engines were built from. The reference model's streaming,
bad-input, cancel and concurrency tests (tests/serve/test_server.py) run unchanged against
them, greedy text equal to the reference backend's `generate`. The run directory is moved
before it is served: its outputs name each other by relative paths (tests/deploy/test_moved_run.py)."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from serve_helpers import deployed, make_pair, write_recipe

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")

# The reference model's tests, collected again here with this module's `served` fixture.
from test_server import (  # noqa: E402, F401
    reference_text,
    request,
    stream,
    test_bad_requests_get_named_errors_and_the_server_keeps_serving,
    test_cancelled_stream_frees_its_slot,
    test_concurrent_requests_are_batched_and_exact,
    test_streaming_deltas_concatenate_to_the_reference_completion,
)

from trtllm_dflash.deploy.settings import REPOSITORY  # noqa: E402
from trtllm_dflash.launch.overlay import with_runners  # noqa: E402
from trtllm_dflash.launch.server import Endpoints, TritonServer, free_ports  # noqa: E402
from trtllm_dflash.recipe import load_recipe  # noqa: E402


# The emulated runners (the engine backend's own runners) run in the default suite; the
# reference runners over the engine deployment only with -m slow (they are the reference model's).
@pytest.fixture(scope="module", params=[pytest.param("reference", marks=pytest.mark.slow), "emulated"])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"engine-{request.param}")
    make_pair(root)
    ports = free_ports(3)
    recipe = load_recipe(write_recipe(root, ports), ["backend=engine"])
    deployed(recipe, root / "pipeline")  # convert, build (dry run: no TensorRT-LLM here), deploy
    out = Path(shutil.move(root / "pipeline", root / "moved" / "pipeline")) / "deploy"
    work = tempfile.TemporaryDirectory()
    repository = with_runners(out / REPOSITORY, recipe.serve.model_name, request.param, Path(work.name))
    server = TritonServer(repository, Endpoints("127.0.0.1", *ports)).start()
    yield recipe, server
    server.stop()
    work.cleanup()


def test_requests_the_greedy_engine_cannot_decode_are_refused_alone(served):
    """The engine runners verify greedily (the Executor registers the verify argmax only:
    runtime/capabilities.py). Sampled, bad-words and log-probs requests arriving among greedy streams
    get one-line refusals naming their field; the greedy streams finish with the reference's text
    (before, the first one failed every request of the round it joined)."""
    import asyncio

    import numpy as np

    recipe, server = served
    if "emulated" not in (server.repository / recipe.serve.model_name / "config.pbtxt").read_text():
        pytest.skip("the reference runners give the full logits: they decode all of these")
    url = server.endpoints.grpc_url
    prompts = [f"def f{i}(x):\n    return x + {i}".encode() for i in range(4)]
    odd = {"temperature": request(max_tokens=16, temperature=(np.float32(1.0), "FP32")),
           "bad_words": request(max_tokens=16, bad_words=(b"return", "BYTES")),
           "return_log_probs": request(max_tokens=16, return_log_probs=(True, "BOOL"))}

    async def mixed():
        greedy = [stream(url, request(p, 16)) for p in prompts]
        return await asyncio.gather(*greedy[:2], *(stream(url, x) for x in odd.values()), *greedy[2:])

    results = asyncio.run(mixed())
    refused = dict(zip(odd, results[2:5]))
    for p, (deltas, _, error) in zip(prompts, results[:2] + results[5:]):
        assert error is None, error
        assert "".join(deltas) == reference_text(recipe, p.decode(), 16)
    for name, (deltas, _, error) in refused.items():
        assert error is not None and f"{name}: " in error and "needs the full verify logits" in error, (name, error)
        assert "\n" not in error.strip()
    deltas, _, error = asyncio.run(stream(url, request(max_tokens=8)))  # still serving
    assert error is None and "".join(deltas) == reference_text(recipe, "def area(r):\n    return", 8)


@pytest.mark.slow  # the streaming test above already compares with the reference's `generate`
def test_served_text_equals_generate(served):
    recipe, server = served
    ckpt = Path(recipe.file).parent / "moved" / "pipeline" / "convert"
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash", "generate", "--checkpoint", str(ckpt), "--prompt",
                           "def area(r):\n    return", "--max-new-tokens", "24"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == reference_text(recipe, "def area(r):\n    return", 24)


def test_runners_override_refuses_a_pytorch_repository(tmp_path):
    from trtllm_dflash.errors import UserError

    model = tmp_path / "repo" / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    with pytest.raises(UserError, match="has no runners parameter"):
        with_runners(tmp_path / "repo", "m", "reference", tmp_path / "work")
    with pytest.raises(UserError, match="--runners gpu: allowed: reference, emulated, tensorrt"):
        with_runners(tmp_path / "repo", "m", "gpu", tmp_path / "work")
