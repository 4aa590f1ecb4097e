"""Concurrency sweep against a running Triton server (the `dflash` model interface).

For each concurrency level C: warm-up requests first (excluded), then max(min_requests,
factor x C) measured requests, C at a time, each a gRPC bidirectional stream (decoupled
model). A request is complete at the response whose `finish_reason` is set (the asyncio
client cannot ask for Triton's empty final response: that parameter is reserved there).
Every chunk's arrival time and token count are recorded (`RequestRecord`); the metrics
come from trtllm_dflash/sweep/metrics.py. Outputs in OUT/: results.jsonl (one row per request),
summary.csv and summary.json (one row per level), and sweep.png (tokens/s/GPU against
tokens/s/user with the Pareto front).
"""

from __future__ import annotations

import asyncio
import csv
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trtllm_dflash.sweep.metrics import LevelSummary, RequestRecord, summarize_level

OUTPUTS = ("text_output", "output_token_count", "rounds", "finish_reason")


def _inputs(prompt: str, max_tokens: int, seed: int, temperature: float):
    import tritonclient.grpc.aio as grpcclient

    def tensor(name, dtype, value):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else None))
        return t

    return [
        tensor("text_input", "BYTES", prompt.encode()),
        tensor("max_tokens", "INT32", np.int32(max_tokens)),
        tensor("stream", "BOOL", True),
        tensor("temperature", "FP32", np.float32(temperature)),
        tensor("seed", "UINT64", np.uint64(seed)),
    ]


async def _grpc_events(client, model: str, record: RequestRecord, prompt: str, max_tokens: int, seed: int,
                       temperature: float):
    """Responses of one gRPC streaming request, as dicts of the dflash model's outputs."""
    import tritonclient.grpc.aio as grpcclient

    request = {
        "model_name": model,
        "inputs": _inputs(prompt, max_tokens, seed, temperature),
        "outputs": [grpcclient.InferRequestedOutput(name) for name in OUTPUTS],
        "request_id": str(record.request_id),
    }

    async def requests():
        yield request

    async for result, error in client.stream_infer(inputs_iterator=requests()):
        if error is not None:
            yield {"error": str(error)}
            return
        if result.get_response().outputs:
            yield {name: result.as_numpy(name).reshape(-1)[0] for name in OUTPUTS}


async def _http_events(session, url: str, model: str, prompt: str, max_tokens: int, seed: int, temperature: float):
    """Responses of one HTTP generate_stream request (server-sent events, one `data:` line each)."""
    body = {"text_input": prompt, "max_tokens": max_tokens, "stream": True, "seed": seed, "temperature": temperature}
    async with session.post(f"http://{url}/v2/models/{model}/generate_stream", json=body) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data:"):
                yield json.loads(line[5:])


async def _consume(record: RequestRecord, events) -> RequestRecord:
    """Fill `record` from a stream of responses; a request ends at the one with a finish_reason."""
    record.start_ns = time.perf_counter_ns()
    texts = []
    try:
        async for event in events:
            now = time.perf_counter_ns()
            if "error" in event:
                record.error = str(event["error"])
                break
            n = int(event.get("output_token_count", 0))
            if n > 0:
                text = event.get("text_output", "")
                record.chunk_ns.append(now)
                record.chunk_tokens.append(n)
                texts.append(text.decode("utf-8") if isinstance(text, bytes) else text)
            record.rounds = int(event.get("rounds", record.rounds))
            if event.get("finish_reason"):
                record.end_ns = now
                break
    except Exception as e:  # a transport failure counts as a failed request, not a crashed sweep
        record.error = f"{type(e).__name__}: {e}"
    if not record.end_ns:
        record.end_ns = time.perf_counter_ns()
        record.error = record.error or "stream ended without a final response"
    record.text = "".join(texts)
    return record


async def run_level(url: str, model: str, prompts: list[str], concurrency: int, measured: int, warmup: int,
                    max_tokens: int, seed: int, temperature: float, on_done=None, protocol: str = "grpc"
                    ) -> list[RequestRecord]:
    if protocol == "http":
        import aiohttp

        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

        async def send(rec, prompt, s):
            return await _consume(rec, _http_events(session, url, model, prompt, max_tokens, s, temperature))

        async def close():
            await session.close()
    else:
        import tritonclient.grpc.aio as grpcclient

        client = grpcclient.InferenceServerClient(url)

        async def send(rec, prompt, s):
            return await _consume(rec, _grpc_events(client, model, rec, prompt, max_tokens, s, temperature))

        async def close():
            await client.close()
    try:
        async def batch(ids: list[int], is_warmup: bool) -> list[RequestRecord]:
            queue = list(ids)
            done: list[RequestRecord] = []

            async def worker():
                while queue:
                    i = queue.pop(0)
                    rec = RequestRecord(request_id=i, concurrency=concurrency, start_ns=0, warmup=is_warmup)
                    await send(rec, prompts[i % len(prompts)], seed + i)
                    done.append(rec)
                    if on_done is not None and not is_warmup:
                        on_done(rec)

            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(ids)))))
            return done

        records = await batch(list(range(warmup)), True) if warmup else []
        records += await batch(list(range(warmup, warmup + measured)), False)
        return sorted(records, key=lambda r: r.request_id)
    finally:
        await close()


@dataclass
class SweepResult:
    out_dir: Path
    levels: list[LevelSummary]
    records: list[RequestRecord]


def run_sweep(url: str, model: str, levels: list[int], requests_at, warmup: int, prompts: list[str],
              max_tokens: int, gpus: int, out_dir: Path, seed: int = 0, temperature: float = 0.0,
              title: str = "", protocol: str = "grpc") -> SweepResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out_dir.mkdir(parents=True, exist_ok=True)
    summaries, all_records = [], []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        for c in levels:
            n = requests_at(c)
            task = progress.add_task(f"concurrency {c:>4}", total=n)
            recs = asyncio.run(run_level(url, model, prompts, c, n, warmup, max_tokens, seed, temperature,
                                         on_done=lambda r: progress.advance(task), protocol=protocol))
            summaries.append(summarize_level(recs, c, gpus))
            all_records += recs
    write_results(out_dir, summaries, all_records, title)
    return SweepResult(out_dir, summaries, all_records)


def write_results(out_dir: Path, summaries: list[LevelSummary], records: list[RequestRecord], title: str) -> None:
    from trtllm_dflash.sweep.report import plot_pareto

    with open(out_dir / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r.to_json()) + "\n")
    rows = [s.flat() for s in summaries]
    with open(out_dir / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out_dir / "summary.json").write_text(json.dumps([asdict(s) for s in summaries], indent=2))
    plot_pareto(summaries, out_dir / "sweep.png", title)
