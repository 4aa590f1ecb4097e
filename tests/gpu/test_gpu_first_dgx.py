"""The first-DGX checks of docs/gpu.md, in its order, for a user's GPU box inside NVIDIA's Triton
26.07 trtllm-python-py3 container (TensorRT-LLM 1.2.1): doctor passes on a built deployment; a
2-layer drafter builds with trtllm-build and drafts like the torch network; at tp 2 the split
drafter's shards open on their ranks' GPUs (two GPUs); one request served by tritonserver gives
the reference backend's greedy tokens. Without TensorRT-LLM they skip with the reason. Not run
yet on such a box: the lent GPU machines have no TensorRT-LLM (docs/results/gpu-runs.md)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from checklist import TINY, checklist_recipe, drafts_like_the_torch_network, needs_trtllm, record
from checkpoints import make_drafter, make_target, write_recipe

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
BF16_TOL = dict(atol=1e-1, rtol=1e-1)  # as test_gpu_checklist.py: bf16 engine against the fp32 torch network
BF16_SETS = [a for o in ("quantization.target_weights=bf16", "quantization.activations=bf16",
                         "quantization.kv_cache=bf16",
                         "quantization.drafter=bf16") for a in ("--set", o)]


# -P: the checkout's trtllm_dflash/ (without plugins/ and recipes/ inside it) stays off sys.path, so the
# package comes from run_all.sh's overlay or the installed copy (docs/gpu.md).
PYTHON = [sys.executable, "-P"]


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*PYTHON, "-m", "trtllm_dflash", *map(str, args)], capture_output=True, text=True, **kw)


@needs_trtllm
def test_1_doctor_says_this_container_can_serve_the_built_deployment(built, tmp_path):
    from trtllm_dflash.deploy.repository import deploy
    from trtllm_dflash.launch.doctor import doctor, ready

    _, _, out = built
    recipe = checklist_recipe()
    checks = doctor(recipe, deploy(recipe, out, tmp_path / "deploy"))
    record("doctor", [c.line() for c in checks])
    assert ready(checks), "\n".join(c.line() for c in checks)


@needs_trtllm
def test_2_a_two_layer_drafter_builds_with_trtllm_build_and_drafts_like_the_torch_network(tmp_path):
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.engines.stage import build
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.runtime.checkpoint import read_checkpoint

    target = make_target(tmp_path / "target")
    drafter = make_drafter(tmp_path / "drafter", target_layers=4)  # 2 layers: two arenas, the layer loop
    recipe = load_recipe(write_recipe(tmp_path / "recipe.yaml", target, drafter, fmt="bf16", backend="engine"))
    assert recipe.drafter_facts.num_layers == 2
    conv = convert(recipe, tmp_path / "convert", progress=False)
    t0 = time.perf_counter()
    result = build(recipe, conv, tmp_path / "build")
    record("two_layer_build_s", time.perf_counter() - t0)
    assert result.built
    agree = drafts_like_the_torch_network(read_checkpoint(conv), result.out, BF16_TOL)
    record("two_layer_drafter_argmax_agreement", agree)
    assert agree >= 0.9


@needs_trtllm
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tp 2 needs two GPUs")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="tp 2 starts its ranks with mpirun")
def test_3_tp2_split_drafter_opens_each_shard_on_its_ranks_gpu(tmp_path):
    """`run --until deploy` at tp 2 with the drafter split (parallel.drafter split), then every rank
    (mpirun -n 2) opens the build with open_trt_engine and reports the GPU its drafter engine, its
    execution context's stream and its all-reduce workspace live on (tests/gpu/rank_devices.py)."""
    run = tmp_path / "run"
    sets = [*BF16_SETS, "--set", "parallel.tp=2", "--set", "parallel.drafter=split"]
    r = cli("run", TINY, *sets, "--until", "build", "--out", run)
    assert r.returncode == 0, r.stderr
    probe = subprocess.run(["mpirun", "--allow-run-as-root", "-n", "2", *PYTHON,
                            str(ROOT / "tests/gpu/rank_devices.py"), str(run / "build")],
                           capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr[-4000:]
    ranks = {d["rank"]: d
             for d in map(json.loads, (line for line in probe.stdout.splitlines() if line.startswith("{")))}
    record("tp2_rank_devices", ranks)
    assert sorted(ranks) == [0, 1]
    for rank, d in ranks.items():
        assert d["stream"] == d["workspace"] == d["current"] == rank, d


@needs_trtllm
@pytest.mark.skipif(shutil.which("tritonserver") is None, reason="no tritonserver (the Triton trtllm container has it)")
def test_4_one_served_request_gives_the_references_greedy_tokens(built, tmp_path):
    import urllib.request

    from trtllm_dflash.deploy.repository import deploy

    _, conv, out = built
    recipe = checklist_recipe()
    dep = deploy(recipe, out, tmp_path / "deploy")
    prompt, n = "def fibonacci(n):\n    ", 16
    want = cli("generate", "--checkpoint", conv, "--prompt", prompt, "--max-new-tokens", n, "--json")
    assert want.returncode == 0, want.stderr
    server = subprocess.Popen([*PYTHON, "-m", "trtllm_dflash", "serve", TINY, *BF16_SETS, "--from", dep, "--run"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{recipe.serve.http_port}"
        deadline = time.monotonic() + 300
        while True:
            try:
                if urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2).status == 200:
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()[-4000:]
                time.sleep(2)
        body = json.dumps({"text_input": prompt, "max_tokens": n, "temperature": 0.0, "stream": True}).encode()
        req = urllib.request.Request(f"{url}/v2/models/{recipe.serve.model_name}/generate_stream", data=body,
                                     headers={"Content-Type": "application/json"})
        events = urllib.request.urlopen(req, timeout=120).read().decode().splitlines()
        text = "".join(json.loads(e[len("data:"):])["text_output"] for e in events if e.startswith("data:"))
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
    record("served_text", text)
    assert text == json.loads(want.stdout)["text"]
