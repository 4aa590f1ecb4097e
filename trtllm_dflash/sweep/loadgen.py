"""Concurrency sweep against a running server: Triton (the `dflash` model interface) or any
OpenAI-compatible endpoint (ours, trtllm-serve, vLLM, SGLang).

For each concurrency level C: warm-up requests first (excluded), then max(min_requests,
factor x C) measured requests, C at a time, each a stream (gRPC, Triton's HTTP
generate_stream or OpenAI's /v1/completions: how each is spoken is in sweep/protocols.py).
Every chunk's arrival time and token count are recorded (`RequestRecord`), and the request's
acceptance as the server reported it (drafted, accepted, histogram: `acceptance_source`
"response", or "nvext.engine_data" behind Dynamo's frontend); the metrics come from
trtllm_dflash/sweep/metrics.py.

One sweep measures several curves on the same server with the same prompts and seeds
(`Variant`: AR, DFlash and DDTree, or DFlash at fixed draft lengths for --tune): each request
carries the curve's per-request settings, the dflash model's optional `mode` and `draft_len`
inputs (HTTP: the same fields; OpenAI: the request extension `"dflash": {"mode", "draft_len"}`
of our server, which echoes the mode it decoded, or behind Dynamo's frontend the annotations
`dflash.mode=...` of our Dynamo worker; a server that does not echo them fails the request).
Levels run in order; inside a level, repeats, and inside a repeat the curves, interleaved.
The files (results.jsonl, summary.csv / .json, sweep.png) are written by sweep/summary.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from trtllm_dflash.sweep.metrics import LevelSummary, RequestRecord, summarize_level
from trtllm_dflash.sweep.protocols import ModelIO, grpc_events, http_events, openai_events


@dataclass(frozen=True)
class Variant:
    """One curve of a sweep: its name and what each of its requests asks the server for."""

    name: str
    mode: str | None = None  # "ar" | "dflash" | "ddtree"; None: send nothing (the server's default)
    draft_len: int | None = None  # drafts per round; None: the server's policy

    def settings(self) -> dict:
        return {k: v for k, v in (("mode", self.mode), ("draft_len", self.draft_len)) if v is not None}


# A request that hears nothing from the server for this long fails: a server (or Triton Python
# stub) that dies mid-request never closes its streams, and a sweep must end, not hang.
STALL_S = 300.0


async def _consume(record: RequestRecord, events, stall_s: float = STALL_S) -> RequestRecord:
    """Fill `record` from a stream of responses; a request ends at the one with a finish_reason,
    and fails after `stall_s` seconds without a response."""
    record.start_ns = time.perf_counter_ns()
    texts = []
    stream = aiter(events)
    try:
        while True:
            try:
                event = await asyncio.wait_for(anext(stream), stall_s)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                record.error = f"no response from the server for {stall_s:g} s"
                break
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
            if event.get("extra_tokens") and record.chunk_tokens:
                record.chunk_tokens[-1] += int(event["extra_tokens"])
            record.rounds = int(event.get("rounds", record.rounds))
            record.drafted = int(event.get("total_draft_tokens", record.drafted))
            _acceptance(record, event)
            if event.get("finish_reason"):
                record.end_ns = now
                break
    except Exception as e:  # a transport failure counts as a failed request, not a crashed sweep
        record.error = f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()
    if not record.end_ns:
        record.end_ns = time.perf_counter_ns()
        record.error = record.error or "stream ended without a final response"
    record.text = "".join(texts)
    return record


def _acceptance(record: RequestRecord, event: dict) -> None:
    """The request's acceptance so far, as the server's response reported it."""
    if "total_accepted_draft_tokens" in event:
        record.accepted = int(event["total_accepted_draft_tokens"])
        record.acceptance_source = event.get("acceptance_source", "response")
    if event.get("acceptance_histogram"):
        record.acceptance_histogram = [int(n) for n in event["acceptance_histogram"]]


async def run_level(url: str, model: str, prompts: list[str], concurrency: int, measured: int, warmup: int,
                    max_tokens: int | Sequence[int], seed: int, temperature: float, on_done=None,
                    protocol: str = "grpc",
                    variant: Variant = Variant("dflash"), repeat: int = 0, io: ModelIO = ModelIO(),
                    stall_s: float = STALL_S) -> list[RequestRecord]:
    """One level of one curve: `warmup` requests (not measured), then `measured`, `concurrency` at a
    time. Request i sends prompt i (mod the prompts) with seed + i, whatever the curve, and asks for
    max_tokens tokens (an int), or max_tokens[i] (mod its length: recipe Sweep.output_lens)."""
    settings = variant.settings()
    lens = [max_tokens] if isinstance(max_tokens, int) else list(max_tokens)
    if protocol in ("http", "openai"):
        import aiohttp

        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        async def send(rec, prompt, s, max_tokens):
            if protocol == "http":
                events = http_events(session, url, model, prompt, max_tokens, s, temperature, settings, io.perf_metrics)
            else:
                events = openai_events(session, url, model, prompt, max_tokens, s, temperature, settings, io.dynamo)
            return await _consume(rec, events, stall_s)

        async def close():
            await session.close()
    else:
        import tritonclient.grpc.aio as grpcclient

        client = grpcclient.InferenceServerClient(url)

        async def send(rec, prompt, s, max_tokens):
            return await _consume(rec, grpc_events(client, model, rec, prompt, max_tokens, s, temperature, settings,
                                                    io), stall_s)

        async def close():
            await client.close()
    try:
        async def batch(ids: list[int], is_warmup: bool) -> list[RequestRecord]:
            queue = list(ids)
            done: list[RequestRecord] = []

            async def worker():
                while queue:
                    i = queue.pop(0)
                    rec = RequestRecord(request_id=i, concurrency=concurrency, start_ns=0, warmup=is_warmup,
                                        curve=variant.name, mode=variant.mode, draft_len=variant.draft_len,
                                        repeat=repeat)
                    await send(rec, prompts[i % len(prompts)], seed + i, lens[i % len(lens)])
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
    levels: list[LevelSummary]  # every curve's levels (per curve and level: the median repeat)
    records: list[RequestRecord]
    repeats: dict[tuple[str, int], list[LevelSummary]] = field(default_factory=dict)  # (curve, level) -> each repeat
    summary: dict = field(default_factory=dict)  # summary.json's object (sweep/summary.py), once written

    @property
    def failed(self) -> int:
        """Failed requests over every curve, level and repeat."""
        return sum(run.failed for runs in self.repeats.values() for run in runs)


def run_sweep(url: str, model: str, levels: list[int], requests_at, warmup: int, prompts: list[str],
              max_tokens: int | Sequence[int], gpus: int, seed: int = 0, temperature: float = 0.0,
              protocol: str = "grpc",
              variants: list[Variant] = (Variant("dflash"),), repeats: int = 1,
              metrics_url: str | None = None, io: ModelIO = ModelIO(), server=None) -> SweepResult:
    """Every curve at every level, `repeats` times: levels in order, inside a level the repeats,
    inside a repeat the curves (so slow drift of the machine hits every curve alike). A curve's
    row at a level is its repeat of median throughput. metrics_url: the server's Prometheus
    /metrics, read before and after each run for its own tau (`server_tau`). `io`: the Triton model's
    shape and what it answers (`ModelIO`). `server`: a sweep/trtllm_acceptance.py ServerAcceptance,
    read around each run for the requests' acceptance where the responses carry none."""
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtllm_dflash.sweep.server_metrics import scrape, settled, totals
    from trtllm_dflash.sweep.trtllm_acceptance import with_server_requests

    per: dict[tuple[str, int], list[LevelSummary]] = {}
    all_records: list[RequestRecord] = []
    width = max(len(v.name) for v in variants)
    console = Console()
    # Off a terminal (a log, a pipe) rich draws no bars while they run, only every bar at the end:
    # there each finished run prints one line instead, and no bars.
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not console.is_terminal) as progress:
        for c in levels:
            n = requests_at(c)
            for r in range(repeats):
                for v in variants:
                    label = f"{v.name:<{width}} c={c:<4}" + (f" repeat {r + 1}" if repeats > 1 else "")
                    task = progress.add_task(label, total=n)
                    before = scrape(metrics_url) if metrics_url else None
                    if server is not None:
                        server.start()
                    recs = asyncio.run(run_level(url, model, prompts, c, n, warmup, max_tokens, seed, temperature,
                                                 on_done=lambda _: progress.advance(task), protocol=protocol,
                                                 variant=v, repeat=r, io=io))
                    row = summarize_level(recs, c, gpus, v.name, v.mode, v.draft_len)
                    if server is not None:
                        row = with_server_requests(row, server.level(), server.source)
                    after = settled(metrics_url, model) if before is not None else None
                    if after is not None:
                        grew = totals(after, model).minus(totals(before, model))
                        row = replace(row, server_tau=grew.tau, server_draft_lens={
                            str(k): v for k, v in sorted(grew.rounds_by_draft_len.items()) if v})
                    per.setdefault((v.name, c), []).append(row)
                    all_records += recs
                    done = f"{label} {_run_line(row)}"
                    if console.is_terminal:
                        progress.update(task, description=done)
                    else:
                        console.print(done, highlight=False)
    rows = [median_repeat(per[(v.name, c)]) for v in variants for c in levels]
    return SweepResult(Path("."), rows, all_records, per)


def _run_line(row: LevelSummary) -> str:
    """What one finished run of a curve at a level measured, for the progress display."""
    user = f"{row.tok_s_user.p50:.1f} tok/s/user p50" if row.tok_s_user else "no tok/s/user"
    failed = f", {row.failed} failed" if row.failed else ""
    return f"{user}, {row.output_tok_s:.1f} tok/s{failed}"


def median_repeat(runs: list[LevelSummary]) -> LevelSummary:
    """The repeat whose throughput is the median (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda s: s.output_tok_s)
    return ranked[(len(ranked) - 1) // 2]

