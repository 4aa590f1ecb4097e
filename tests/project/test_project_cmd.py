"""`trtllm-dflash project` and `bench acceptance` end to end through the CLI (in process)."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.project.projection import AR, BANDS, BEST
from trtllm_dflash.recipe import list_recipes
from trtllm_dflash.sweep.metrics import Distribution, LevelSummary

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
GPU_RECIPES = sorted(p for p in list_recipes() if p.parent.name in ("hopper", "blackwell"))
PNG = b"\x89PNG\r\n\x1a\n"


def run_json(args, capsys) -> dict:
    assert main(args + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_project_runs_for_every_shipped_gpu_recipe(recipe, tmp_path, capsys):
    out = tmp_path / "p"
    data = run_json(["project", str(recipe), "--out", str(out)], capsys)
    assert {AR, BANDS, BEST} <= set(data["curves"]) and data["acceptance"]["source"]
    ar, bands = data["curves"][AR], data["curves"][BANDS]
    assert [r["concurrency"] for r in ar] == data["levels"]
    # Rows are sweep rows: they load back as LevelSummary, and DFlash beats AR per user at c=1.
    rows = [LevelSummary.from_json(r) for r in bands]
    assert rows[0].tok_s_user.p50 > LevelSummary.from_json(ar[0]).tok_s_user.p50
    # Throughput grows and interactivity falls with concurrency.
    assert [r.output_tok_s_per_gpu for r in rows] == sorted(r.output_tok_s_per_gpu for r in rows)
    per_user = data["headline"]["bands_vs_ar"]["max_tok_s_user"]
    assert per_user[BANDS] > per_user[AR]
    assert data["steps"][BANDS][0]["bytes_read"] > 0 and data["steps"][BANDS][0]["verify_flops"] > 0
    assert (out / "projection.png").read_bytes()[:8] == PNG
    header = (out / "projection.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["curve", "draft_len"] and "concurrency" in header and "tok_s_user_p50" in header


def test_project_table_names_the_headline_and_the_suggested_bands(tmp_path, capsys):
    recipe = RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml"
    assert main(["project", str(recipe), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for words in ("headline ratios", "500-600", "suggested speculative.draft_len", "model card"):
        assert words in text
    assert "…" not in text and max(map(len, text.splitlines())) <= 100  # a log gets 100 columns, every digit


# the h100-qwen3-8b recipe's bands before `auto` became its default (its comment keeps them)
MODEL_CARD_BANDS = "speculative.draft_len=[{max_concurrency: 8, draft_len: 15}, {max_concurrency: 64, draft_len: 7}]"


def test_speculation_off_is_suggested_where_ar_is_faster_and_auto_is_modelled_by_its_aim(tmp_path, capsys):
    """With poor acceptance AR beats every draft length at high concurrency: the suggested bands
    turn speculation off there (0), and an `auto` recipe's curve takes the best length per level,
    0 included (the 'best draft length' curve stays DFlash-only, K >= 1)."""
    low = tmp_path / "low.yaml"
    low.write_text("tau: 1.4\ndraft_len: 15\nsource: a poor drafter\n")
    base = ["project", str(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"), "--acceptance", str(low),
            "--levels", "1,16,64"]
    fixed = run_json(base + ["--out", str(tmp_path / "a"), "--set", MODEL_CARD_BANDS], capsys)
    assert fixed["suggested_bands"][-1]["draft_len"] == 0
    assert min(fixed["draft_lens"][BEST]) >= 1
    auto = run_json(base + ["--out", str(tmp_path / "b"), "--set", "speculative.draft_len=auto"], capsys)
    off = [c for c, k in zip([1, 16, 64], auto["draft_lens"][BANDS]) if k == 0]
    assert off and auto["draft_lens"][BANDS] != fixed["draft_lens"][BANDS]
    # the policy's projected curve never falls below AR (per level: the best of AR and every length)
    user = lambda rows: [r["tok_s_user"]["p50"] for r in rows]  # noqa: E731
    assert all(a >= r for a, r in zip(user(auto["curves"][BANDS]), user(auto["curves"][AR])))
    assert any(b < r for b, r in zip(user(fixed["curves"][BEST]), user(fixed["curves"][AR])))  # a fixed length does
    assert [b["draft_len"] for b in auto["suggested_bands"]] == [b["draft_len"] for b in fixed["suggested_bands"]]


def _sweep_dir(path: Path, rows: list[tuple[int, float, float]]) -> Path:
    """A sweep output directory with summary.json rows (concurrency, tok/s/user, tok/s/GPU)."""
    path.mkdir()
    levels = []
    for c, user, gpu in rows:
        d = Distribution(5, user, user, user, user, user, user)
        tpot = Distribution(5, 1 / user, 1 / user, 1 / user, 1 / user, 1 / user, 1 / user)
        levels.append(asdict(LevelSummary(c, 5, 0, 1.0, 100, gpu, gpu, 3.0, None, tpot, d, None, None)))
    (path / "summary.json").write_text(json.dumps(levels))
    return path


def test_measured_sweep_is_overlaid_and_compared(tmp_path, capsys):
    recipe = RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"
    proj = run_json(["project", str(recipe), "--out", str(tmp_path / "a")], capsys)
    bands = {r["concurrency"]: r for r in proj["curves"][BANDS]}
    # A "measured" sweep 10% slower than the projection at c=1 and 4, plus a level it did not project.
    measured = _sweep_dir(tmp_path / "sweep", [(c, bands[c]["tok_s_user"]["p50"] / 1.1,
                                                bands[c]["output_tok_s_per_gpu"] / 1.1)
                                                for c in (1, 4)] + [(3, 50, 50)])
    data = run_json(["project", str(recipe), "--out", str(tmp_path / "b"), "--measured", str(measured)], capsys)
    cmp_rows = data["measured"]["vs_projection"]
    assert [(r["concurrency"], r["measured_curve"], r["projected_curve"]) for r in cmp_rows] == [(1, "dflash", BANDS),
                                                                                              (4, "dflash", BANDS)]
    assert all(r["tok_s_user_error"] == pytest.approx(0.1) for r in cmp_rows)
    assert len(data["measured"]["curves"][""]) == 3
    assert (tmp_path / "b" / "projection.png").read_bytes()[:8] == PNG
    assert main(["project", str(recipe), "--out", str(tmp_path / "c"), "--measured", str(measured)]) == 0
    assert "measured sweep vs projection" in capsys.readouterr().out


def test_acceptance_file_and_assumptions_change_the_projection(tmp_path, capsys):
    recipe = RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"
    base = run_json(["project", str(recipe), "--out", str(tmp_path / "a")], capsys)
    acc = tmp_path / "acc.yaml"
    acc.write_text("tau: 3.0\ndraft_len: 15\nsource: a pessimistic guess\n")
    low = run_json(["project", str(recipe), "--out", str(tmp_path / "b"), "--acceptance", str(acc)], capsys)
    assert low["acceptance"]["source"].startswith("a pessimistic guess")
    assert low["curves"][BANDS][0]["tok_s_user"]["p50"] < base["curves"][BANDS][0]["tok_s_user"]["p50"]
    fast = run_json(["project", str(recipe), "--out", str(tmp_path / "c"), "--assume", "step_overhead_ms=0"], capsys)
    assert fast["assumptions"]["step_overhead_ms"] == 0
    assert fast["curves"][AR][0]["tok_s_user"]["p50"] > base["curves"][AR][0]["tok_s_user"]["p50"]
    lv = run_json(["project", str(recipe), "--out", str(tmp_path / "d"), "--levels", "1,3"], capsys)
    assert lv["levels"] == [1, 3]


def test_levels_that_do_not_fit_are_left_out(tmp_path, capsys):
    recipe = RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"
    data = run_json(["project", str(recipe), "--out", str(tmp_path), "--levels", "1,64,65,5000",
                     "--set", "build.max_batch_size=6000"], capsys)
    assert 1 in data["levels"] and 5000 not in data["levels"]
    assert "memory plan" in data["skipped_levels"]["5000"]
    assert main(["project", str(recipe), "--out", str(tmp_path), "--levels", "65,128"]) == 2
    assert "no concurrency level to project: 65: above build.max_batch_size 64" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--acceptance", "missing.json"], "--acceptance missing.json: file not found"),
    (["--acceptance", "poetry"], "--acceptance poetry: drafter 'qwen3-8b-dflash-b16' has published acceptance for"),
    (["--assume", "speed=2"], "--assume 'speed=2': expected KEY=VALUE with KEY one of"),
    (["--assume", "tensor_efficiency=1.5"], "--assume tensor_efficiency: 1.5 is out of range"),
    (["--assume", "seq_overhead_us=inf"], "--assume seq_overhead_us: 'inf' is not a finite number"),
    (["--assume", "step_overhead_ms=nan"], "--assume step_overhead_ms: 'nan' is not a finite number"),
    (["--out", "pyproject.toml"], "--out pyproject.toml: exists and is not a directory"),
    (["--measured", "."], "--measured .: no summary.json"),
    (["--levels", "a,b"], "--levels: expected comma-separated integers"),
    (["--calibrate"], "--calibrate: measures this machine; recipe 'h100-qwen3-8b-fp8' runs on h100-sxm"),
])
def test_bad_input_is_one_line_with_exit_code_2(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("a file, not a directory\n")
    rc = main(["project", str(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"), "--out", str(tmp_path / "o")] + args)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_bench_acceptance_json_feeds_project(tmp_path, capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["bench", "acceptance", "--prompts", "2", "--prompt-len", "32", "--max-new-tokens", "24",
                     "--threads", "1", "--json"]) == 0
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(out)
    assert res["recipe"] == "cpu-tiny-pystd" and len(res["conditional_acceptance"]) == 15
    assert res["tau"] == pytest.approx(res["tau_by_draft_len"]["15"]) and res["reached"][0] > 0
    acc = tmp_path / "acc.json"
    acc.write_text(out)
    data = run_json(["project", str(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml"), "--out", str(tmp_path / "p"),
                     "--acceptance", str(acc)], capsys)
    assert data["acceptance"]["conditional_acceptance"] == res["conditional_acceptance"]


def test_bench_acceptance_refuses_bad_numbers(capsys):
    assert main(["bench", "acceptance", "--prompts", "0"]) == 2
    assert "--prompts is 0, expected >= 1" in capsys.readouterr().err
    assert main(["bench", "acceptance", "--prompt-len", "5000"]) == 2  # the tiny target has 512 positions
    err = capsys.readouterr().err
    assert "prompt length 5000 + max new tokens 128 = 5128 > the target's max_position_embeddings 512" in err, err


def test_a_gpu_runs_measured_attention_fraction_replaces_the_assumption(tmp_path, capsys):
    """perf/bench_kv_inject.py's JSON line (median hbm_fraction of its rows) -> measured attention."""
    recipe = str(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml")
    bench = tmp_path / "kv.json"
    rows = [{"batch": 8, "cache_len": n, "hbm_fraction": f} for n, f in ((1024, 0.6), (4096, 0.8), (16384, 0.9))]
    bench.write_text("table ...\n" + json.dumps({"bench": "kv_inject_attention", "hardware": "h100-sxm",
                                                  "hbm_gbs": 3350, "rows": rows}) + "\n")
    # fixed bands: under `auto` faster attention may also change the projected draft lengths
    base = run_json(["project", recipe, "--out", str(tmp_path / "a"), "--set", MODEL_CARD_BANDS], capsys)
    fast = run_json(["project", recipe, "--out", str(tmp_path / "b"), "--attention-bench", str(bench),
                     "--set", MODEL_CARD_BANDS], capsys)
    assert "attention kernel" in fast["rates"]
    assert fast["steps"][BANDS][-1]["target_attention_ms"] == pytest.approx(
        base["steps"][BANDS][-1]["target_attention_ms"] * 0.5 / 0.8)
    bench.write_text(json.dumps({"bench": "kv_inject_attention", "hardware": "b200", "rows": rows}))
    assert main(["project", recipe, "--out", str(tmp_path / "c"), "--attention-bench", str(bench)]) == 2
    assert "measured on 'b200', the recipe runs on 'h100-sxm'" in capsys.readouterr().err


def test_a_sweep_with_ar_and_dflash_curves_compares_each_with_its_projection(tmp_path, capsys):
    recipe = RECIPES / "hopper" / "h100-llama-3.1-8b-fp8.yaml"
    proj = run_json(["project", str(recipe), "--out", str(tmp_path / "a")], capsys)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    levels = []
    for curve, projected in (("ar", AR), ("dflash", BANDS), ("ddtree", None)):
        for row in proj["curves"][projected or BANDS][:2]:
            levels.append({**row, "curve": curve, "requests": 5})  # sweep rows name their curve
    (sweep / "summary.json").write_text(json.dumps(levels))
    data = run_json(["project", str(recipe), "--out", str(tmp_path / "b"), "--measured", str(sweep)], capsys)
    pairs = {(r["measured_curve"], r["projected_curve"]) for r in data["measured"]["vs_projection"]}
    assert pairs == {("ar", AR), ("dflash", BANDS)}  # DDTree is not projected: overlaid only
    assert all(abs(r["tok_s_gpu_error"]) < 1e-9 for r in data["measured"]["vs_projection"])
    assert set(data["measured"]["curves"]) == {"ar", "dflash", "ddtree"}


@pytest.mark.parametrize("overrides, words", [
    ([], "one replica, no routing"),
    (["parallel.tp=4", "parallel.replicas=2"], "ceil(c / 2) requests on the busiest of 2 replicas"),
])
def test_the_router_the_replica_split_assumes_is_stated(overrides, words):
    """project splits endpoint concurrency evenly over parallel.replicas: it says so, and names the
    router `serve --api dynamo` writes for the recipe (round-robin on 1.3: no prefix reuse)."""
    from trtllm_dflash.project.projection import router_line
    from trtllm_dflash.recipe import load_recipe

    line = router_line(load_recipe(RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml", overrides))
    assert line.startswith("router: ") and words in line
    if "replicas=2" in " ".join(overrides):
        assert "Dynamo" in line and line.endswith("`serve --api dynamo` writes round-robin for this recipe")
    kv = router_line(load_recipe(RECIPES / "hopper" / "h200-qwen3-coder-30b-a3b-fp8.yaml",
                                 ["backend.trtllm_version=1.4.0rc1", "parallel.replicas=2", "hardware.count=4"]))
    assert "KV router" in kv and "not modelled, the even split is assumed" in kv
