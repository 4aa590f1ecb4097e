"""`sweep --api openai` measures what `sweep --api triton` measures.

Both real servers serve the same deploy output of the embedded default (tritonserver with the
dflash model, and `serve --api openai`); the same greedy sweep against each must give the same
tokens for every request, and at concurrency 1 the same verify passes (so the same tau). Above
concurrency 1 which requests share a round depends on timing, and a batch of another size can
flip a near-tie among the drafter's proposals: the output stays the target's (lossless) but a
round may accept one token fewer or more, so tau there agrees closely, not exactly.
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
pytest.importorskip("fastapi", reason="needs fastapi + uvicorn (the serve extra)")

from serve_helpers import start_openai_server, stop_server  # noqa: E402
from trtllm_dflash.deploy.settings import REPOSITORY  # noqa: E402
from trtllm_dflash.launch.server import Endpoints, TritonServer, free_port, free_ports  # noqa: E402
from trtllm_dflash.pipeline import run  # noqa: E402
from trtllm_dflash.recipe import load_recipe  # noqa: E402
from trtllm_dflash.sweep.stage import sweep  # noqa: E402

# fixed draft lengths: the APIs are compared round for round, and under the recipe's `auto` a
# round's length follows each server's own live state
SMALL = ["sweep.min_requests=4", "sweep.warmup_requests=1", "sweep.output_len=32", "speculative.draft_len=[]"]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The two servers start, and stop, side by side: most of a start or a stop is waiting (for a
    model's load, for Triton's once-a-second unload poll)."""
    root = tmp_path_factory.mktemp("apis")
    recipe = load_recipe(None, SMALL)
    run(recipe, root, until="deploy", progress=False, say=lambda _: None)
    # Four different ports at once: the OpenAI server binds its own only once started, so ports
    # chosen one call at a time could hand tritonserver the same one.
    port, *triton_ports = free_ports(4)
    with ThreadPoolExecutor(1) as pool:
        openai = pool.submit(start_openai_server, [arg for kv in SMALL for arg in ("--set", kv)], root / "deploy", port)
        triton = TritonServer(root / "deploy" / REPOSITORY, Endpoints("127.0.0.1", *triton_ports))
        try:
            triton.start()
            proc = openai.result()
        except BaseException:  # neither server outlives a failed start
            triton.stop()
            if openai.exception() is None:
                stop_server(openai.result())
            raise
    yield recipe, root, triton, f"127.0.0.1:{port}"
    with ThreadPoolExecutor(1) as pool:
        stopped = pool.submit(stop_server, proc)
        triton.stop()
        stopped.result()


def rows(out):
    return sorted((json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()),
                  key=lambda r: (r["concurrency"], r["request_id"]))


@pytest.mark.slow
def test_openai_sweep_gives_the_tokens_and_tau_of_the_triton_sweep(both, tmp_path):
    recipe, root, triton, openai_url = both
    # The deployment's own mode (DDTree: the embedded default has a budget) on both APIs.
    e = triton.endpoints
    a = sweep(recipe, e.grpc_url, tmp_path / "triton", levels=[1, 2], from_dir=root / "deploy",
              modes=["ddtree"], metrics_url=f"http://{e.host}:{e.metrics_port}/metrics")
    b = sweep(recipe, openai_url, tmp_path / "openai", levels=[1, 2], protocol="openai", from_dir=root / "deploy")
    ra, rb = rows(tmp_path / "triton"), rows(tmp_path / "openai")
    assert len(ra) == len(rb) == sum(max(4, 5 * c) + 1 for c in (1, 2))
    for x, y in zip(ra, rb):
        assert x["error"] is None and y["error"] is None
        assert (x["request_id"], x["output_tokens"]) == (y["request_id"], y["output_tokens"])
        assert x["text"].startswith(y["text"]) and y["text"]  # the OpenAI text ends before a stop token's text
        if x["concurrency"] == 1:
            assert x["rounds"] == y["rounds"], f"request {x['request_id']}: verify passes differ at concurrency 1"
    for la, lb in zip(a.levels, b.levels):
        assert la.output_tokens == lb.output_tokens and la.failed == lb.failed == 0 and la.tau >= 1.0
        assert la.tau == lb.tau if la.concurrency == 1 else la.tau == pytest.approx(lb.tau, rel=0.05)
        assert lb.output_tok_s > 0 and lb.tpot_s is not None
    # Each server's own counters (/metrics) give the tau of the level's requests, warm-up included:
    # (tokens - 1) / verify passes over those requests, as the responses reported them.
    for result, recs in ((a, ra), (b, rb)):
        for level in result.levels:
            mine = [r for r in recs if r["concurrency"] == level.concurrency]
            expected = sum(r["output_tokens"] - 1 for r in mine) / sum(r["rounds"] for r in mine)
            assert level.server_tau == pytest.approx(expected, rel=1e-9), (level.concurrency, level.tau)
            # ... and the draft length each request ran in each of those passes
            assert sum(level.server_draft_lens.values()) == sum(r["rounds"] for r in mine)
            assert sum(int(k) * n for k, n in level.server_draft_lens.items()) == sum(r["drafted"] for r in mine)


@pytest.mark.slow
def test_sweep_command_with_api_openai(both, tmp_path):
    recipe, root, _, openai_url = both
    cmd = [sys.executable, "-m", "trtllm_dflash", "sweep", *sum((["--set", s] for s in SMALL), []), "--url",
           f"http://{openai_url}/v1", "--api", "openai", "--out", str(tmp_path), "--levels", "2", "--json",
           "--from", str(root / "deploy")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    levels = [lv for lv in json.loads(r.stdout[r.stdout.index("{"):])["levels"] if lv["curve"] == "ddtree"]
    assert [lv["concurrency"] for lv in levels] == [2] and levels[0]["failed"] == 0 and levels[0]["tau"] >= 1.0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["extra"]["protocol"] == "openai" and manifest["extra"]["model"] == "dflash"
    # A server with one model is measured under its own id (trtllm-serve names it by its path).
    no_from = cmd[: cmd.index("--from")]
    r = subprocess.run(no_from + ["--set", "serve.model_name=other"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and json.loads((tmp_path / "manifest.json").read_text())["extra"]["model"] == "dflash"


@pytest.mark.slow
def test_sweep_fails_the_requests_for_a_model_the_server_does_not_serve(both, tmp_path):
    from trtllm_dflash.cli import main

    recipe, root, triton, openai_url = both
    # A model the server does not serve fails every request with the server's error, not the sweep.
    assert main(["sweep", "--out", str(tmp_path), "--levels", "1", "--url", openai_url, "--api", "openai",
                 "--model", "other", "--set", "sweep.min_requests=1", "--set", "sweep.warmup_requests=0"]) == 1
    failed = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert failed and all("HTTP 404: model: 'other' does not exist" in row["error"] for row in failed)


def test_sweep_refuses_no_server_and_a_wrong_api(tmp_path, capsys):
    from trtllm_dflash.cli import main

    base = ["sweep", "--out", str(tmp_path), "--levels", "1"]
    assert main(base + ["--url", f"127.0.0.1:{free_port()}", "--api", "openai"]) == 2
    assert "no OpenAI-compatible server answers GET /v1/models" in capsys.readouterr().err
    assert main(base + ["--url", f"127.0.0.1:{free_port()}", "--api", "openai", "--http"]) == 2
    assert "--http: only with --api triton" in capsys.readouterr().err
