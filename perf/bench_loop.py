"""The round loop's host cost: what the serving loop spends in Python per round, with runners that
cost nothing (perf/zero_cost.py), beside the round the recipe's GPU is projected to take.

    trtllm-dflash bench loop [RECIPE] [--levels 1,4,16,64,128] [--drafts 15,auto] [--rounds 100]
        [--repeats 3] [--output-len 512] [--json] [--plot PNG] [--record JSON]

The real `ServingEngine` (serve/batcher.py: admission, the policy, the reference Decoder's round,
delivery with detokenization, the server's metrics) over zero-cost runners of the recipe's shapes
(default recipes/hopper/h100-qwen3-8b-fp8.yaml: vocabulary, hidden size, block size). Each of `c`
closed-loop requests streams `--output-len` tokens of the shipped held-out Python text, tokenized
with the embedded tiny-pystd tokenizer (a byte-level BPE, PreTrainedTokenizerFast: the recipe's
own tokenizer is not downloaded here); when one finishes the next starts. Acceptance is drawn from
the projection's per-slot profile (`project`'s: project/acceptance.py resolve). `auto` is the
recipe's policy (policy/auto.py) with its start-up cost from the projection (loop_costs.py) and
the step model as its shape model (project/rounds.py), and each round teaches it what the
projection says that round costs plus what the loop took.

Per level and draft setting, medians over --repeats interleaved runs of --rounds timed rounds
after --warm ones: rounds/s, host µs per round and per request per round, the runners' own share
(their few tensor ops), the engine thread's CPU time, and the share of the recipe's projected
round (project/stepmodel.py, at the draft length used). Then one profiled run per draft setting at
the largest level: the top functions by own time (cProfile, shares of the profiled run). Then the
engine runners' host side: EngineTarget (runtime/engine_runners.py) over an Executor stand-in that
answers at once (loop_costs.InstantExecutor), µs per row per verify round.
With --json the last stdout line is one JSON object.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import threading
import time

from trtllm_dflash.perf.loop_costs import TIMERS, engine_host, projected_policy, workload
from trtllm_dflash.perf.zero_cost import Scripts, ZeroCostModel

DEFAULT_RECIPE = "hopper/h100-qwen3-8b-fp8.yaml"
LEVELS = (1, 4, 16, 64, 128)
DRAFTS = ("15", "auto")


def run_level(setup: dict, c: int, draft: str, rounds: int, warm: int, profile: bool = False,
              device_s: float = 0.0, overlap: bool = False) -> dict:
    """One closed-loop run of `c` requests: the figures of `rounds` rounds after `warm`. device_s:
    each verify also waits this long without the GIL (a device step); overlap: ServingEngine's
    (host figures then come from the device thread: read the wall)."""
    from trtllm_dflash.serve.batcher import ServingEngine
    from trtllm_dflash.serve.metrics import PrometheusInstruments, SpecMetrics
    from trtllm_dflash.serve.record import Request

    pairs, f = setup["pairs"], setup["facts"]
    scripts = Scripts({tuple(p): s for p, s in pairs}, setup["profile"].conditional, f["vocab"], seed=c)
    model = ZeroCostModel(scripts, vocab=f["vocab"], hidden=f["hidden"], block=f["block"], max_batch=c,
                          device_s=device_s)
    # auto: the recipe's policy under projected costs; a fixed length: each request's own draft_len
    policy = {"policy": projected_policy(setup["projected"], f["block"], c)} if draft == "auto" else {}
    out, done, blocks, prof = {}, threading.Event(), [], cProfile.Profile() if profile else None

    def clock(n: int) -> None:  # the engine thread, after each verify
        if n == warm:
            out.update(t0=time.perf_counter(), cpu0=time.thread_time(), stub0=scripts.seconds,
                       copy0=TIMERS.seconds["copies"],
                       deliver0=TIMERS.seconds["delivery"])
            if prof is not None:
                prof.enable()
        elif n == warm + rounds:
            if prof is not None:
                prof.disable()
            out.update(t1=time.perf_counter(), cpu1=time.thread_time(), stub1=scripts.seconds,
                       copy1=TIMERS.seconds["copies"],
                       deliver1=TIMERS.seconds["delivery"])
            done.set()

    model.target.on_verify = clock
    engine = ServingEngine(model, setup["tokenizer"], mode="dflash", block_size=f["block"],
                           max_seq_len=setup["max_seq_len"], max_batch_size=c,
                           metrics=SpecMetrics(PrometheusInstruments(), "bench"), overlap=overlap,
                           **policy)
    _verify_lengths(model.target, blocks, warm)
    nxt = iter(range(10**9))

    def submit() -> None:
        prompt, _ = pairs[next(nxt) % len(pairs)]
        engine.submit(Request(list(prompt), setup["output_len"], emit, stop_token_ids=[],
                              draft_len=None if draft == "auto" else int(draft)))

    def emit(update) -> None:
        if update.finish_reason in ("stop", "length") and not done.is_set():
            submit()
        elif update.finish_reason is not None and not done.is_set():  # a failed request: the bench stops
            out["error"] = update.finish_reason
            done.set()

    for _ in range(c):
        submit()
    finished = done.wait(600)
    engine.stop()
    if not finished or "error" in out:
        raise RuntimeError(f"bench loop: c={c} draft {draft}: {out.get('error') or f'{rounds} rounds took over 600 s'}")
    wall, cpu, stub = out["t1"] - out["t0"], out["cpu1"] - out["cpu0"], out["stub1"] - out["stub0"]
    copies, delivery = out["copy1"] - out["copy0"], out["deliver1"] - out["deliver0"]
    res = {"c": c, "draft": draft, "rounds": rounds, "rounds_s": rounds / wall, "wall_us_round": wall / rounds * 1e6,
           "host_us_round": cpu / rounds * 1e6, "host_us_request": cpu / rounds / c * 1e6,
           "runners_us_round": stub / rounds * 1e6, "copies_us_round": copies / rounds * 1e6,
           "delivery_us_round": delivery / rounds * 1e6,
           "draft_len": statistics.mean(blocks[:rounds]) if blocks else 0.0}
    if prof is not None:
        res["top"] = top_costs(prof)
    return res


def _verify_lengths(target, blocks: list, warm: int) -> None:
    """Record each timed round's longest draft (the verify block's T - 1)."""
    inner = target.verify

    def verify(tokens, start, lengths=None):
        if target.verifies >= warm:
            blocks.append(tokens.shape[1] - 1)
        return inner(tokens, start, lengths)

    target.verify = verify


def top_costs(prof: cProfile.Profile, n: int = 10) -> list[dict]:
    """The n functions of most own time, as shares of the profiled run."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values()) or 1.0
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [{"function": f"{os.path.basename(file)}:{line} {name}", "calls": v[1], "share": v[2] / total}
            for (file, line, name), v in rows]


def setup_for(recipe, profile, projected, output_len: int, prompt_len: int, requests: int = 256) -> dict:
    """What every run shares. profile: the acceptance (project/acceptance.py AcceptanceProfile);
    projected: the recipe's rounds (project/rounds.py ProjectedRounds)."""
    from transformers import AutoTokenizer

    from trtllm_dflash.recipe import load_recipe

    tok_dir = load_recipe(None).target.path  # the embedded tiny-pystd tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    t, block = recipe.target_facts, recipe.speculative.block_size
    return {"tokenizer": tokenizer, "tokenizer_name": f"tiny-pystd ({type(tokenizer).__name__}, byte-level BPE, "
            f"{len(tokenizer)} tokens)", "profile": profile,
            "pairs": workload(tokenizer, requests, prompt_len, output_len + 2 * block),
            "facts": {"vocab": t.vocab_size, "hidden": t.hidden_size, "block": block},
            "projected": projected, "output_len": output_len, "prompt_len": prompt_len,
            "max_seq_len": prompt_len + output_len + 2 * block}


def bench(recipe, profile, projected, *, levels=LEVELS, drafts=DRAFTS, rounds: int = 100, warm: int = 20,
          repeats: int = 3, output_len: int = 512, prompt_len: int = 32, engine_rounds: int = 24, say=print) -> dict:
    """The whole benchmark (module docstring); profile and projected as setup_for takes them."""
    with TIMERS.timing():
        setup = setup_for(recipe, profile, projected, output_len, prompt_len)
        return _bench(recipe, setup, levels, drafts, rounds, warm, repeats, engine_rounds, say)


def _bench(recipe, setup, levels, drafts, rounds, warm, repeats, engine_rounds, say) -> dict:
    output_len, prompt_len = setup["output_len"], setup["prompt_len"]
    f = setup["facts"]
    speed = machine_speed()
    say(f"bench loop: {recipe.name}: vocab {f['vocab']}, hidden {f['hidden']}, block {f['block']}; "
        f"{setup['tokenizer_name']}; acceptance {setup['profile'].source}; this machine now: a small torch op "
        f"{speed['torch_op_us']:.1f} µs, a Python call {speed['python_call_ns']:.0f} ns")
    runs: dict[tuple, list[dict]] = {}
    for r in range(repeats):  # interleaved: a shared machine's drifting load falls on every row alike
        for c in levels:
            for d in drafts:
                runs.setdefault((c, d), []).append(run_level(setup, c, d, rounds, warm))
        say(f"  repeat {r + 1}/{repeats} done")
    rows = [_median_row(v, setup["projected"]) for v in runs.values()]
    top = {d: run_level(setup, max(levels), d, rounds, warm, profile=True)["top"] for d in drafts}
    engine = [_engine_row(c, f, prompt_len, max(2, min(engine_rounds, 512 // c)), setup["profile"].conditional)
              for c in levels]
    overlap = [overlap_row(setup, c, max(10, rounds // 4), warm) for c in levels if c <= 64]
    return {"bench": "loop_host_cost", "recipe": recipe.name, "facts": f, "tokenizer": setup["tokenizer_name"],
            "acceptance": setup["profile"].source, "output_len": output_len, "prompt_len": prompt_len,
            "rounds": rounds, "repeats": repeats, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "machine_speed": speed,
            "rows": rows, "top": top, "engine": engine, "overlap": overlap}


def overlap_row(setup: dict, c: int, rounds: int, warm: int, draft: int = 15) -> dict:
    """Wall µs per round with the device step a sleep of the projected GPU round, the loop serial
    and overlapped (ServingEngine(overlap=True)), run one after the other: what overlap hides."""
    device_s = setup["projected"].round_s(c, draft)
    serial, over = (run_level(setup, c, str(draft), rounds, warm, device_s=device_s, overlap=o) for o in (False, True))
    hidden = serial["wall_us_round"] - over["wall_us_round"]
    return {"c": c, "draft": draft, "device_us": device_s * 1e6, "serial_us": serial["wall_us_round"],
            "overlap_us": over["wall_us_round"], "serial_host_us": serial["host_us_round"],
            "delivery_us": serial["delivery_us_round"], "hidden_us": hidden,
            "speedup": serial["wall_us_round"] / over["wall_us_round"]}


def machine_speed() -> dict:
    """How fast this machine runs the loop's ingredients right now (a shared machine's load moves
    every figure): the median CPU time of a small torch op and of a Python function call."""
    import torch

    x = torch.zeros(4, 4)

    def per_call(f, n: int) -> float:
        runs = []
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(n):
                f()
            runs.append((time.thread_time() - t0) / n)
        return statistics.median(runs)

    return {"torch_op_us": per_call(lambda: x.add(1), 2000) * 1e6,
            "python_call_ns": per_call(lambda: None, 20000) * 1e9}


def loop_cost(res: dict) -> dict:
    """The loop's host µs per round as fixed + per_request x c: least squares over the rows of the
    largest fixed draft length, with what the step model records beside it (project/rates.py)."""
    import platform

    fixed_rows = [r for r in res["rows"] if r["draft"] != "auto"]
    K = max(int(r["draft"]) for r in fixed_rows)
    pts = [(r["c"], r["host_us_round"]) for r in fixed_rows if int(r["draft"]) == K]
    n, mx, my = len(pts), sum(c for c, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((c - mx) * (y - my) for c, y in pts) / sum((c - mx) ** 2 for c, _ in pts) if n > 1 else 0.0
    return {"fixed_us": round(max(0.0, my - slope * mx), 1), "per_request_us": round(max(0.0, slope), 2),
            "draft_len": K, "levels": [c for c, _ in pts], "recipe": res["recipe"],
            "output_len": res["output_len"], "tokenizer": res["tokenizer"],
            "machine": {"cpus": res["cpus"], "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version(),
                        "load_average": [round(x, 1) for x in res["load_average"]]},
            "command": "trtllm-dflash bench loop --record trtllm_dflash/project/loop_cost.json"}


def _engine_row(c: int, f: dict, prompt_len: int, rounds: int, conditional) -> dict:
    """EngineTarget's host side: with context rows of the recipe's hidden size (the copies of them
    a CPU makes are device work on a GPU) and of size 1 (the host's own work)."""
    full = engine_host(c, f["vocab"], f["hidden"], f["block"], prompt_len, rounds, conditional)
    host = engine_host(c, f["vocab"], 1, f["block"], prompt_len, rounds, conditional)
    return {**full, "us_row_host": host["us_row"], "us_round_host": host["us_round"]}


def _median_row(runs: list[dict], projected) -> dict:
    row = {k: runs[0][k] for k in ("c", "draft", "rounds")}
    for k in ("rounds_s", "wall_us_round", "host_us_round", "host_us_request", "runners_us_round", "copies_us_round",
              "delivery_us_round", "draft_len"):
        row[k] = statistics.median(r[k] for r in runs)
    K = round(row["draft_len"])
    row["projected_ms"] = projected.round_s(row["c"], K) * 1e3
    row["share"] = row["host_us_round"] * 1e-3 / row["projected_ms"]
    return row


def table(res: dict, file=sys.stdout) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(file=file, highlight=False, width=160)
    t = Table(title=f"{res['recipe']}: the round loop's host cost, zero-cost runners ({res['output_len']}-token "
              f"outputs, median of {res['repeats']})")
    for col in ("draft", "c", "rounds/s", "wall µs", "host µs", "host µs/req", "runners µs", "copies µs",
                "delivery µs", "K used", "GPU ms", "share"):
        t.add_column(col, justify="right")
    for r in res["rows"]:
        t.add_row(r["draft"], str(r["c"]), f"{r['rounds_s']:,.0f}", f"{r['wall_us_round']:,.0f}",
                  f"{r['host_us_round']:,.0f}", f"{r['host_us_request']:,.1f}", f"{r['runners_us_round']:,.0f}",
                  f"{r['copies_us_round']:,.0f}", f"{r.get('delivery_us_round', 0):,.0f}", f"{r['draft_len']:.1f}",
                  f"{r['projected_ms']:.2f}", f"{r['share']:.1%}")
    t.caption = ("per round; host = the engine thread's CPU time (wall: elapsed, on a shared machine more); "
                 "host µs/req = host / c; runners = the "
                 "zero-cost runners' own tensor ops; ctx copies = the loop's copies of [B, T, hidden] context rows "
                 "(reference/rounds.py Batch.extend / keep, _pend: device memory work, a memcpy here); delivery = "
                 "ServingEngine._deliver (what overlap with the next device step could hide); all inside host; share "
                 "= host / the projected GPU round at the draft length used (GPU ms: project/rounds.py, "
                 "without the loop's "
                 f"own cost). Tokenizer: {res['tokenizer']}; "
                 f"acceptance: {res['acceptance']}")
    con.print(t)
    for d, rows in res["top"].items():
        con.print(f"top costs, draft {d}, c={max(r['c'] for r in res['rows'])} (cProfile own time):")
        for x in rows:
            con.print(f"  {x['share']:6.1%}  {x['calls']:>8}  {x['function']}")
    if res.get("loop_cost"):
        lc = res["loop_cost"]
        con.print(f"the loop's cost per round (draft {lc['draft_len']}, least squares over c): "
                  f"{lc['fixed_us']:,.0f} µs "
                  f"+ {lc['per_request_us']:,.1f} µs per request")
    e = Table(title="engine runners' host side: EngineTarget.verify over an instant Executor")
    for col in ("c", "host µs/row/round", "µs/round", "with hidden-size rows: µs/row/round"):
        e.add_column(col, justify="right")
    for r in res["engine"]:
        e.add_row(str(r["c"]), f"{r.get('us_row_host', float('nan')):,.1f}", f"{r.get('us_round_host', 0):,.0f}",
                  f"{r['us_row']:,.1f}")
    e.caption = ("host: context rows of size 1; with hidden-size rows: of the recipe's hidden size, whose "
                 "stacking a CPU copies (device work on a GPU)")
    con.print(e)
    _overlap_table(res, con)


def _overlap_table(res: dict, con) -> None:
    from rich.table import Table

    o = Table(title="overlap: the device step as a sleep of the projected GPU round (draft 15), wall µs per round")
    for col in ("c", "device µs", "serial µs", "overlapped µs", "serial/overlapped", "hidden µs", "serial host µs",
                "of it delivery µs"):
        o.add_column(col, justify="right")
    for r in res.get("overlap", []):
        o.add_row(str(r["c"]), f"{r['device_us']:,.0f}", f"{r['serial_us']:,.0f}", f"{r['overlap_us']:,.0f}",
                  f"{r['speedup']:.3f}", f"{r['hidden_us']:,.0f}", f"{r['serial_host_us']:,.0f}",
                  f"{r['delivery_us']:,.0f}")
    o.caption = ("hidden = serial - overlapped wall: what the device thread's wait covers. Overlap moves the "
                 "delivery behind the next step (the rest of the host's round stays serial); on a shared machine the "
                 "wall also holds waits for a core, which the overlapped loop pays less often")
    con.print(o)


def plot(res: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for d in sorted({r["draft"] for r in res["rows"]}):
        rows = [r for r in res["rows"] if r["draft"] == d]
        ax.plot([r["c"] for r in rows], [r["host_us_request"] for r in rows], marker="o", label=f"draft {d}")
    ax.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="host µs per request per round",
           title=f"{res['recipe']}: loop host cost")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def add_arguments(p) -> None:
    p.add_argument("recipe", nargs="?", default=None,
                   help=f"recipe YAML (default: the shipped {DEFAULT_RECIPE})")
    p.add_argument("--levels", default=",".join(map(str, LEVELS)))
    p.add_argument("--drafts", default=",".join(DRAFTS), help="fixed draft lengths and/or auto (default 15,auto)")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--warm", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32: admission pads every "
                   "running row's context rows to the prompt's length, device work that grows with it)")
    p.add_argument("--engine-rounds", type=int, default=24, help="engine runners' verify rounds (at most 512 rows "
                   "in all, at least 2 rounds)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", default=None, help="write a PNG of µs per request per round")
    p.add_argument("--record", default=None, metavar="JSON",
                   help="write the loop's cost per round (fixed + per request, fitted to the fixed-draft rows) with "
                   "this machine's description: the step model's overhead term (trtllm_dflash/project/loop_cost.json)")
