"""Soak test: many concurrent streaming clients against a real tritonserver for minutes.

Every client loops over a fixed set of prompts (greedy), streaming each response over
gRPC; every completed response must equal the reference backend's single-request output
for that prompt, and no request may fail or come back truncated. Prints one JSON line.

    python -m trtllm_dflash.perf.soak [RECIPE] --clients 64 --seconds 120

Without RECIPE it uses the embedded CPU recipe.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def expected_outputs(recipe, checkpoint: Path, prompts: list[str], max_tokens: int) -> list[str]:
    """Single-request greedy outputs of the reference backend on the deployed checkpoint (the oracle)."""
    from transformers import AutoTokenizer

    from trtllm_dflash.runtime.checkpoint import read_checkpoint
    from trtllm_dflash.runtime.checkpoint_runner import checkpoint_steps

    tok = AutoTokenizer.from_pretrained(read_checkpoint(checkpoint).tokenizer_dir)
    spec = recipe.speculative
    out = []
    for p in prompts:
        steps = checkpoint_steps(checkpoint, [tok(p)["input_ids"]], max_tokens, block_size=spec.block_size,
                                 mode="ddtree" if spec.ddtree_budget else "dflash", ddtree_budget=spec.ddtree_budget)
        out.append(tok.decode([t for rec in steps for t in rec.tokens[0]]))
    return out


async def client_loop(url: str, model: str, prompts: list[str], expected: list[str], max_tokens: int,
                      deadline: float, offset: int, stats: dict) -> None:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    i = offset
    try:
        while time.monotonic() < deadline:
            k = i % len(prompts)
            i += 1
            inputs = []
            for name, value, dtype in (("text_input", prompts[k].encode(), "BYTES"),
                                       ("max_tokens", np.int32(max_tokens), "INT32"), ("stream", True, "BOOL")):
                t = grpcclient.InferInput(name, [1], dtype)
                t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else None))
                inputs.append(t)

            async def requests():
                yield {"model_name": model, "inputs": inputs}

            text, finished, error = [], False, None
            try:
                async for result, err in client.stream_infer(inputs_iterator=requests()):
                    if err is not None:
                        error = str(err)
                        break
                    if result.get_response().outputs:
                        text.append(result.as_numpy("text_output")[0].decode())
                        if result.as_numpy("finish_reason")[0]:
                            finished = True
                            break
            except Exception as e:  # transport failures count as failed requests
                error = f"{type(e).__name__}: {e}"
            stats["requests"] += 1
            if error is not None:
                stats["failed"] += 1
                stats.setdefault("errors", []).append(error[:200])
            elif not finished:
                stats["truncated"] += 1
            elif "".join(text) != expected[k]:
                stats["mismatched"] += 1
    finally:
        await client.close()


def soak(recipe, clients: int, seconds: float, max_tokens: int, prompts: list[str]) -> dict:
    from trtllm_dflash.artifacts import Manifest
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.launch.server import Endpoints, TritonServer
    from trtllm_dflash.pipeline import run

    stats = {"requests": 0, "failed": 0, "truncated": 0, "mismatched": 0}
    with tempfile.TemporaryDirectory() as tmp:
        run(recipe, Path(tmp), until="deploy", progress=False, say=lambda _: None)  # convert (+ quantize), deploy
        repo = Path(tmp) / "deploy"
        artifact = repo / Manifest.read(repo).extra["artifact"]  # relative to the deploy output
        expected = expected_outputs(recipe, artifact, prompts, max_tokens)
        endpoints = Endpoints.free()
        with TritonServer(repo / REPOSITORY, endpoints):
            t0 = time.monotonic()

            async def run():
                deadline = time.monotonic() + seconds
                await asyncio.gather(*(client_loop(endpoints.grpc_url, recipe.serve.model_name, prompts, expected,
                                                   max_tokens, deadline, c, stats) for c in range(clients)))

            asyncio.run(run())
            elapsed = time.monotonic() - t0
    stats.update(clients=clients, seconds=round(elapsed, 1), max_tokens=max_tokens,
                 requests_per_s=round(stats["requests"] / elapsed, 2), recipe=recipe.name)
    stats["errors"] = stats.get("errors", [])[:5]
    return stats


def main(argv: list[str] | None = None) -> int:
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.recipe import load_recipe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", nargs="?", default=None)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=16, help="distinct prompts the clients cycle through")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe, [f"build.max_batch_size={max(args.clients, 1)}",
                                       f"build.max_num_tokens={max(args.clients, 1) * 64}"], check_rules=False)
    prompts = load_prompts(recipe.sweep.dataset, args.prompts, recipe.sweep.input_len, recipe.sweep.seed)
    stats = soak(recipe, args.clients, args.seconds, args.max_tokens, prompts)
    print(json.dumps(stats))
    ok = stats["requests"] > 0 and not (stats["failed"] or stats["truncated"] or stats["mismatched"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
