"""A sweep's curves on synthetic levels: summary.json (every curve, its front, the headline
ratios), summary.csv, the table at 100 columns, the plot, the curves a sweep measures, and the
draft-length bands of --tune (accepted by `check`)."""

import csv
import json

import pytest
import yaml
from rich.console import Console
from test_metrics import MS, rec

from trtllm_dflash.cli import main
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.sweep import summary as files
from trtllm_dflash.sweep.loadgen import Variant
from trtllm_dflash.sweep.metrics import summarize_level
from trtllm_dflash.sweep.report import headline_table, summary_table, tune_table
from trtllm_dflash.sweep.stage import read_summary, sweep_variants
from trtllm_dflash.sweep.tune import best_bands, set_argument, tune_summary, write_snippet


def level(c, gap_ms, tokens=(1, 5, 5), curve="dflash", rounds=3, start=0):
    """c requests with chunks every gap_ms: tokens/s/user = (sum(tokens) - 1) / (2 gap)."""
    recs = [rec(i, start=start + i * MS, chunks=tuple((20 + k * gap_ms, n) for k, n in enumerate(tokens)),
                rounds=rounds,
                curve=curve) for i in range(c)]
    return summarize_level(recs, c, gpus=1, curve=curve, mode=curve)


def sweep_rows():
    ar = [level(c, g, (1, 1, 1), "ar", rounds=2) for c, g in ((1, 2), (2, 4), (4, 5))]
    dfl = [level(c, g) for c, g in ((1, 6), (2, 8), (4, 12))]
    return ar + dfl


def test_summary_has_every_curve_its_front_and_the_headline(tmp_path):
    rows = sweep_rows()
    summary = files.write(tmp_path, rows, [], "synthetic")
    levels = json.loads((tmp_path / "summary.json").read_text())
    assert levels == json.loads(json.dumps(summary["levels"]))
    assert [r["curve"] for r in levels] == ["ar"] * 3 + ["dflash"] * 3
    assert all(r["on_front"] for r in levels) and all("vs_ar" in r for r in levels[3:]) and "vs_ar" not in levels[0]
    head = json.loads((tmp_path / "headline.json").read_text())
    assert head["fronts"] == {"ar": [1, 2, 4], "dflash": [1, 2, 4]} and head == {k: summary[k] for k in head}
    cmp = head["headline"]["dflash_vs_ar"]
    # tokens/s/user = (tokens - 1) / (2 gap): AR 2 / (2 gap), DFlash 10 / (2 gap)
    assert cmp["max_tok_s_user"] == {"dflash": pytest.approx(10 / 0.012), "ar": pytest.approx(2 / 0.004)}
    equal_c = {"1": (10 / 12) / (2 / 4), "2": (10 / 16) / (2 / 8), "4": (10 / 24) / (2 / 10)}
    assert cmp["tok_s_user_ratio_at_equal_label"] == pytest.approx(equal_c)
    assert [r["vs_ar"]["tok_s_user_ratio"] for r in levels[3:]] == pytest.approx(list(equal_c.values()))
    assert cmp["overlap_tok_s_user"] == pytest.approx([10 / 0.024, 2 / 0.004])  # DFlash's slowest .. AR's fastest
    assert cmp["throughput_ratios"] and all(r["ratio"] > 1 for r in cmp["throughput_ratios"])
    # Only DFlash's c=4 point (416.7 tok/s/user) lies inside the overlap: the others have no ratio at equal speed.
    assert [r["vs_ar"]["tok_s_gpu_ratio"] is not None for r in levels[3:]] == [False, False, True]
    assert levels[5]["vs_ar"]["tok_s_gpu_ratio"] == pytest.approx(cmp["throughput_ratios"][0]["ratio"])
    assert files.read_curves(tmp_path)["ar"][2].concurrency == 4 and len(read_summary(tmp_path)) == 6
    assert files.read_headline(tmp_path) == head["headline"]
    assert [r.concurrency for r in read_summary(tmp_path, "dflash")] == [1, 2, 4]
    with pytest.raises(UserError, match="has no 'ddtree' curve"):
        read_summary(tmp_path, "ddtree")
    with open(tmp_path / "summary.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["curve"], r["concurrency"]) for r in table][:2] == [("ar", "1"), ("ar", "2")] and len(table) == 6
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Rows of an older sweep name no curve.
    (tmp_path / "summary.json").write_text(json.dumps([{k: v for k, v in r.items() if k not in ("curve", "mode")}
                                                       for r in levels[3:]]))
    assert list(files.read_curves(tmp_path)) == [""]


def test_tables_fit_a_100_column_terminal():
    rows = sweep_rows() + [level(c, 9, curve="dflash L=15") for c in (1, 2, 128)]
    head = {k: c.to_json() for k, c in files.headline(files.by_curve(rows)).items()}
    console = Console(record=True, width=100)
    console.print(summary_table(rows, "a sweep"))
    console.print(headline_table(head))
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 100
    for header in ("curve", "conc", "tok/s", "/GPU", "/user", "TTFT", "TPOT", "tau", "drafts"):
        assert header in text
    assert "DFlash / AR tok/s/GPU at equal tok/s/user" in text and "c=1:" in text and "AR" in text
    assert "128 *" in text or "128  " in text


def test_the_servers_own_counts_get_their_columns_and_csv_fields():
    """With the server's /metrics read: its tau, and the share of request rounds without drafts
    (what `draft_len: auto` chose per request), in the table and the CSV row."""
    from dataclasses import replace

    row = replace(level(4, 9), server_tau=2.5, server_draft_lens={"0": 3.0, "7": 6.0, "15": 3.0})
    assert row.zero_draft_share == 0.25 and row.flat()["zero_draft_share"] == 0.25
    console = Console(record=True, width=120)
    console.print(summary_table([row], "a sweep"))
    text = console.export_text()
    assert "no" in text and "draft" in text and "25%" in text and "2.50" in text
    assert replace(level(4, 9)).zero_draft_share is None


def test_the_curves_a_sweep_measures():
    budget, plain = load_recipe(None), load_recipe(None, ["speculative.ddtree_budget=null"])
    assert [v.name for v in sweep_variants(budget)] == ["ar", "dflash", "ddtree"]
    assert sweep_variants(plain) == [Variant("ar", "ar"), Variant("dflash", "dflash")]
    # OpenAI: the server's own mode only, unless named; only other modes use the request extension.
    assert sweep_variants(budget, protocol="openai") == [Variant("ddtree")]
    assert sweep_variants(plain, ["ar", "dflash"], "openai") == [Variant("ar", "ar"), Variant("dflash")]
    tuned = sweep_variants(plain, tune=[7, 0, 15])
    assert [(v.name, v.draft_len) for v in tuned] == [("dflash L=0", 0), ("dflash L=7", 7), ("dflash L=15", 15),
                                                     ("dflash", None)]
    for modes, message in ((["ddtree"], "no speculative.ddtree_budget"), (["tree"], "'tree' is not one of"),
                           (["ar", "ar"], "names a mode twice")):
        with pytest.raises(UserError, match=message):
            sweep_variants(plain, modes)
    with pytest.raises(UserError, match=r"--tune-draft-lens: expected draft lengths in 0..15"):
        sweep_variants(plain, tune=[16])


def test_tune_picks_the_fastest_draft_length_per_level_and_check_accepts_the_bands(tmp_path, capsys):
    assert best_bands({1: 15, 2: 15, 4: 7, 8: 0, 16: 0}) == [
        {"max_concurrency": 2, "draft_len": 15}, {"max_concurrency": 4, "draft_len": 7},
        {"max_concurrency": 16, "draft_len": 0}]
    variants = [Variant("dflash L=0", "dflash", 0), Variant("dflash L=15", "dflash", 15), Variant("dflash", "dflash")]
    # output tok/s per (curve, level, repeat) through the gaps between chunks: a smaller gap is faster
    gaps = {("dflash L=0", 1): (9, 9, 9), ("dflash L=15", 1): (4, 5, 4), ("dflash", 1): (4, 4, 6),
            ("dflash L=0", 4): (6, 7, 6), ("dflash L=15", 4): (9, 8, 9), ("dflash", 4): (6, 6, 7)}
    runs = {key: [level(key[1], g, curve=key[0]) for g in gs] for key, gs in gaps.items()}
    tune = tune_summary(runs, variants, [1, 4])
    assert tune["best"]["1"]["draft_len"] == 15 and tune["best"]["4"]["draft_len"] == 0
    assert tune["bands"] == [{"max_concurrency": 1, "draft_len": 15}, {"max_concurrency": 4, "draft_len": 0}]
    assert tune["policy_over_best"]["1"] == pytest.approx(1.0) and tune["policy_over_best"]["4"] == pytest.approx(1.0)
    console = Console(record=True, width=100)
    console.print(tune_table(tune))
    assert "L=15" in console.export_text() and "…" not in console.export_text()
    snippet = write_snippet(tmp_path / "draft_len.yaml", tune, load_recipe(None))
    assert yaml.safe_load(snippet.read_text()) == {"speculative": {"draft_len": tune["bands"]}}
    assert set_argument(tune["bands"]) in snippet.read_text()
    capsys.readouterr()
    assert main(["check", "--set", set_argument(tune["bands"])]) == 0
    recipe = load_recipe(None, [set_argument(tune["bands"])])
    assert [recipe.speculative.draft_len_at(c) for c in (1, 2, 4, 64)] == [15, 0, 0, 0]


PYTORCH = "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"


@pytest.mark.parametrize("args,message", [
    ([PYTORCH, "--api", "openai", "--tune"], "--tune: fixed draft lengths are per-request settings"),
    ([PYTORCH], "--api triton speaks the dflash model interface"),
    (["--tune", "--modes", "ar"], "--modes: not with --tune"),
    (["--tune-draft-lens", "1,3"], "--tune-draft-lens: only with --tune"),
    (["--tune", "--tune-draft-lens", "1,99"], "--tune-draft-lens: expected draft lengths in 0..15"),
    (["--modes", " , "], "--modes: expected comma-separated modes"),
])
def test_sweep_refuses_settings_it_cannot_measure_before_sending_a_request(args, message, tmp_path, capsys):
    """One line naming the option, exit 2; nothing is sent (the URL answers nothing)."""
    from pathlib import Path

    recipe_args = [str(Path(__file__).resolve().parents[2] / a) if a == PYTORCH else a for a in args]
    rc = main(["sweep", *recipe_args, "--url", "127.0.0.1:9", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "s").exists()
