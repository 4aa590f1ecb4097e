"""Serving overhead: tokens/s/user of the served model at concurrency 1 against in-process
decoding of the same deployed checkpoint, the same prompts and the same threads, in one run.

    trtllm-dflash bench serve [RECIPE] [--prompts 8] [--repeats 5] [--torch-threads N] [--json]

The recipe is deployed as `run --until deploy` does (into --work, default runs/<recipe name>;
current stages are skipped). Three ways to decode the sweep's prompts, greedy, one request
at a time, interleaved request by request (the order rotates) --repeats times after a warm-up
(the load of a shared machine drifts over seconds: it falls on every path alike):

  served      tritonserver with the deployed dflash model, the sweep's gRPC streaming client
  engine      the same loader (serve/deployed.open_deployed) in this process: the ServingEngine
              thread, its tokenizer and per-round delivery, without Triton
  inprocess   the same Decoder, admit + step in a plain loop (the policy's draft lengths)

tokens/s/user is the sweep's (sweep/metrics.py): (tokens - 1) / (last chunk - first chunk),
per request; a repeat reports each path's median request, and the result is the median over
the repeats of each path and of each ratio: served_over_inprocess (the goal: >= 0.9 on the 2-core
development machine), served_over_engine (what Triton's Python backend and the client
cost) and engine_over_inprocess (what the engine thread costs).

The per-round time split comes from timestamps of the server itself (serve/trace.py: the
server runs with TRACE_ENV set) lined up with the client's chunk arrivals, all on one
CLOCK_MONOTONIC: decode (decoder.step), backend (delivery: detokenize, response, send),
send (of which Triton's response sender), loop (the engine thread between rounds),
response (sender returned -> chunk at the client: Python-backend IPC, Triton core, gRPC,
client library), round (the server's round period) and chunk_gap (the client's); plus CPU
seconds per round of the server's processes and of the client (the machine has few cores:
every busy thread beside torch's slows decoding). The engine pass is traced the same way.

With --json the last stdout line is one JSON object (fields: see `summarize`).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

PATHS = ("served", "engine", "inprocess")
SPLIT = ("decode", "backend", "send", "loop", "response", "round", "chunk_gap")


def user_rate(arrivals_ns: list[int], tokens: int) -> float | None:
    """tokens/s/user of one request from its chunk arrival times: (tokens - 1) / (last - first)."""
    if tokens < 2 or len(arrivals_ns) < 2 or arrivals_ns[-1] <= arrivals_ns[0]:
        return None
    return (tokens - 1) / ((arrivals_ns[-1] - arrivals_ns[0]) * 1e-9)


def median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def split(rows: list[list], requests: list[tuple[str, int, int, list[int]]]) -> dict:
    """Mean ms per round of each part of the serving path (SPLIT), from trace rows (serve/trace.py)
    and the client's view of each request: (tag, start_ns, end_ns, chunk arrival ns). Concurrency 1:
    a request's rows are those with its tag inside its [start, end]; response k of a request is the
    prefill's (k = 0) or round k's, and arrives as chunk k. Parts without data are None."""
    parts: dict[str, list[float]] = {k: [] for k in SPLIT}
    for tag, start, end, arrivals in requests:
        def inside(kind):
            return sorted((r for r in rows if r[0] == kind and start <= r[2] <= end
                           and (tag == r[1] if kind == "send" else tag in r[1])), key=lambda r: r[2])
        admits, rounds, sends = inside("admit"), inside("round"), inside("send")
        before = admits[0][4] if admits else None  # end of the previous step's delivery
        for k, (_, _, t0, t1, t2) in enumerate(rounds, start=1):
            parts["decode"].append(t1 - t0)
            parts["backend"].append(t2 - t1)
            if before is not None:
                parts["loop"].append(t0 - before)
            if k < len(rounds):
                parts["round"].append(rounds[k][2] - t0)
            before = t2
        for k, (_, _, s0, s1) in enumerate(sends):
            parts["send"].append(s1 - s0)
            if k < len(arrivals):
                parts["response"].append(arrivals[k] - s1)
        parts["chunk_gap"] += [b - a for a, b in zip(arrivals[1:], arrivals[2:])]  # rounds after the first
    return {k: (sum(v) / len(v) * 1e-6 if v else None) for k, v in parts.items()}


def summarize(repeats: list[dict[str, float]], splits: dict[str, dict], extra: dict) -> dict:
    """The benchmark's JSON object. repeats: per repeat, the median tokens/s/user of each path
    (PATHS); splits: per path, `split` of its rounds (and CPU ms per round)."""
    def ratio(a, b):
        return median(r[a] / r[b] for r in repeats if r.get(a) and r.get(b))

    return {
        **extra,
        **{f"{p}_tok_s_user": median(r.get(p) for r in repeats) for p in PATHS},
        "served_over_inprocess": ratio("served", "inprocess"),
        "served_over_engine": ratio("served", "engine"),
        "engine_over_inprocess": ratio("engine", "inprocess"),
        "repeats": repeats,
        "split_ms_per_round": splits,
    }


# ----------------------------------------------------------------------------- measuring


def _group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group `pgid`."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()
        if int(f[2]) == pgid:
            total += int(f[11]) + int(f[12])
    return total / tick


def _served(url: str, model: str, prompt: str, max_tokens: int, pgid: int) -> dict:
    """One streamed request through tritonserver (the sweep's gRPC client)."""
    from trtllm_dflash.sweep.loadgen import run_level

    cpu0, srv0 = time.process_time(), _group_cpu_s(pgid)
    (rec,) = asyncio.run(run_level(url, model, [prompt], 1, 1, 0, max_tokens, 0, 0.0))
    cpu1, srv1 = time.process_time(), _group_cpu_s(pgid)
    if rec.error:
        raise RuntimeError(f"served request failed: {rec.error}")
    return {"rate": user_rate(rec.chunk_ns, rec.output_tokens), "rounds": rec.rounds, "tokens": rec.output_tokens,
            "request": (str(rec.request_id), rec.start_ns, rec.end_ns, rec.chunk_ns),
            "cpu_s": {"server": srv1 - srv0, "client": cpu1 - cpu0}}


def _engine(deployed, ids: list[int], max_tokens: int, tag: str) -> dict:
    """One request through the ServingEngine of this process (its emit callback is the client)."""
    from trtllm_dflash.serve.record import Request
    from trtllm_dflash.serve.trace import now

    arrivals, done, last = [], threading.Event(), []

    def emit(update):
        if update.tokens:
            arrivals.append(now())
        if update.finish_reason is not None:
            last.append(update)
            done.set()

    cpu0, start = time.process_time(), now()
    deployed.engine.submit(Request(ids, max_tokens, emit, tag=tag))
    if not done.wait(600) or last[0].finish_reason not in ("stop", "length"):
        raise RuntimeError(f"in-process engine request {tag} did not finish: "
                           f"{last[0].finish_reason if last else 'timeout'}")
    return {"rate": user_rate(arrivals, last[0].total_tokens), "rounds": last[0].spec.rounds,
            "tokens": last[0].total_tokens,
            "request": (tag, start, now(), arrivals), "cpu_s": {"process": time.process_time() - cpu0}}


def _inprocess(deployed, ids: list[int], max_tokens: int) -> dict:
    """One request through the Decoder in a plain loop: what decoding costs without any serving."""
    from trtllm_dflash.policy.decision import FULL_BLOCK
    from trtllm_dflash.reference.verify import SamplingParams
    from trtllm_dflash.serve.trace import now

    engine, model = deployed.engine, deployed.model
    # as serve/batcher.py: the engine's policy for the modes it sets, else the full block
    policy = engine.policy if engine.mode in engine.policy.modes else FULL_BLOCK
    decode = []
    cpu0 = time.process_time()
    decoder = model.decoder(sampling=SamplingParams(), **engine.decoder_args)
    try:
        rec = decoder.admit([0], [ids], [max_tokens], [model.eos_token_ids])
        arrivals, n = [now()], len(rec.tokens[0])
        while decoder.running:
            drafts = policy.decide([0], 1, engine.mode)
            t0 = now()
            rec = decoder.step(drafts)
            arrivals.append(now())
            decode.append(arrivals[-1] - t0)
            policy.learn(rec, decode[-1] * 1e-9)  # now(): ns
            n += len(rec.tokens[0])
        policy.forget(0)
    finally:
        model.release(decoder)
    return {"rate": user_rate(arrivals, n), "rounds": len(arrivals) - 1, "tokens": n, "decode_ns": decode,
            "cpu_s": {"process": time.process_time() - cpu0}}


def _cpu_ms_per_round(results: list[dict]) -> dict:
    rounds = sum(r["rounds"] for r in results)
    keys = results[0]["cpu_s"]
    return {k: 1e3 * sum(r["cpu_s"][k] for r in results) / rounds for k in keys}


def bench(recipe, work: Path, *, prompts: int = 8, max_tokens: int | None = None, repeats: int = 5,
          torch_threads: int | None = None, say=print) -> dict:
    """Deploy `recipe` into `work` (current stages skipped), then measure the three paths."""
    import torch

    from trtllm_dflash import pipeline
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.launch.overlay import with_parameters
    from trtllm_dflash.launch.server import Endpoints, TritonServer
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.serve.deployed import open_deployed, repository_model
    from trtllm_dflash.serve.trace import TRACE_ENV, Trace, read

    pipeline.run(recipe, work, until="deploy", progress=False, say=say)
    sw, name = recipe.sweep, recipe.serve.model_name
    max_tokens = max_tokens or sw.output_len
    texts = load_prompts(sw.dataset, prompts, sw.input_len, sw.seed)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        repository = Path(work) / "deploy" / REPOSITORY
        if torch_threads is not None:
            repository = with_parameters(repository, name, {"torch_threads": str(torch_threads)}, Path(tmp),
                                         "`bench serve --torch-threads`")
        version_dir, settings = repository_model(repository.parent, name)  # both are <dir>/model_repository
        trace_path, local_trace = Path(tmp) / "server.jsonl", Path(tmp) / "engine.jsonl"
        endpoints = Endpoints.free()
        with TritonServer(repository, endpoints, env={TRACE_ENV: str(trace_path)}) as server:
            local = open_deployed(version_dir, settings)  # this process: the same loader, engine, policy, threads
            local.engine.trace = Trace(str(local_trace))
            try:
                ids = [local.tokenizer(t)["input_ids"] for t in texts]
                say(f"bench serve: {recipe.name} ({local.mode}), {prompts} prompts x {max_tokens} tokens, "
                    f"torch threads {torch.get_num_threads()}, {repeats} repeats")
                runs = {
                    "served": lambda i, r: _served(endpoints.grpc_url, name, texts[i], max_tokens, server.proc.pid),
                    "engine": lambda i, r: _engine(local, ids[i], max_tokens, f"e{r}-{i}"),
                    "inprocess": lambda i, r: _inprocess(local, ids[i], max_tokens),
                }
                for p, run in runs.items():  # warm-up: caches, threads, the allocator
                    run(0, -1)
                # Interleaved request by request (the order rotates), so that the load of a shared
                # machine, which drifts over seconds, falls on every path alike.
                results = {p: [] for p in PATHS}
                per_repeat = []
                for r in range(repeats):
                    rates = {p: [] for p in PATHS}
                    for i in range(prompts):
                        k = (r * prompts + i) % 3
                        for p in PATHS[k:] + PATHS[:k]:
                            res = runs[p](i, r)
                            results[p].append(res)
                            rates[p].append(res["rate"])
                    row = {p: median(rates[p]) for p in PATHS}
                    per_repeat.append(row)
                    say("  repeat {}: ".format(r + 1) + ", ".join(f"{p} {row[p]:.1f}" for p in PATHS)
                        + f" tok/s/user; served/inprocess {row['served'] / row['inprocess']:.3f}")
            finally:
                local.close()
            time.sleep(0.5)  # the server writes a request's rows after its last response
        rows = read(trace_path) if trace_path.exists() else []
        local_rows = read(local_trace) if local_trace.exists() else []
    decode = [d for res in results["inprocess"] for d in res["decode_ns"]]
    splits = {
        "served": {**split(rows, [res["request"] for res in results["served"]]),
                   "cpu_ms": _cpu_ms_per_round(results["served"])},
        "engine": {**split(local_rows, [res["request"] for res in results["engine"]]),
                   "cpu_ms": _cpu_ms_per_round(results["engine"])},
        "inprocess": {"decode": sum(decode) / len(decode) * 1e-6, "cpu_ms": _cpu_ms_per_round(results["inprocess"])},
    }
    served = results["served"]
    tokens, rounds = sum(r["tokens"] for r in served), sum(r["rounds"] for r in served)
    extra = {"recipe": recipe.name, "mode": local.mode, "prompts": prompts, "max_tokens": max_tokens,
             "repeats": repeats, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
             "load_average": os.getloadavg(), "tau": (tokens - len(served)) / rounds if rounds else None}
    return summarize(per_repeat, splits, extra)


def print_report(res: dict, file=sys.stdout) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, highlight=False)
    t = Table(title=f"{res['recipe']}: served vs in-process at concurrency 1 ({res['mode']}, "
                    f"{res['torch_threads']} torch threads, median of {len(res['repeats'])})")
    for col in ("path", "tok/s/user", "vs inprocess"):
        t.add_column(col, justify="right")
    for p in PATHS:
        v = res[f"{p}_tok_s_user"]
        r = {"served": res["served_over_inprocess"], "engine": res["engine_over_inprocess"], "inprocess": 1.0}[p]
        t.add_row(p, f"{v:.1f}" if v else "-", f"{r:.3f}" if r else "-")
    console.print(t)
    s = Table(title="ms per round (mean)")
    s.add_column("path")
    for col in (*SPLIT, "CPU ms"):
        s.add_column(col, justify="right")
    for p in PATHS:
        d = res["split_ms_per_round"][p]
        cpu = " + ".join(f"{v:.2f}" for v in d.get("cpu_ms", {}).values())
        s.add_row(p, *[f"{d[k]:.3f}" if d.get(k) is not None else "-" for k in SPLIT], cpu)
    s.caption = ("decode = decoder.step; backend = delivery after it (send = the response sender); loop = between "
                 "rounds; response = sender -> client; CPU ms = server + client (served), this process (others)")
    console.print(s)
    console.print(f"served_over_inprocess {res['served_over_inprocess']:.3f} (goal >= 0.9), served_over_engine "
                  f"{res['served_over_engine']:.3f}, engine_over_inprocess {res['engine_over_inprocess']:.3f}")
