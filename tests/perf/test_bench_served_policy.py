"""`trtllm-dflash bench policy` (perf/bench_served_policy.py): its inputs are checked by name, its
goals are the draft-length issue's, and a tiny served run gives every curve at every level."""

import json

import pytest

from trtllm_dflash.cli import main
from trtllm_dflash.perf.bench_served_policy import goals, markdown, repeat_ratios


@pytest.mark.parametrize("args,message", [
    (["--fixed", "3,16"], "--fixed: 16 is outside 0..15"),
    (["--levels", "1,32"], "--levels: 32 is outside 1..16"),
    (["--levels", "1,x"], "--levels '1,x': expected comma-separated integers"),
    (["--repeats", "0"], "--repeats is 0, expected >= 1"),
])
def test_bad_inputs_are_refused_by_name(args, message, capsys):
    assert main(["bench", "policy", *args]) == 2
    assert message in capsys.readouterr().err


def _level(c, ar, best, dflash, ddtree):
    return {"concurrency": c, "tok_s_user_p50": {"ar": ar, "dflash L=3": best, "dflash": dflash, "ddtree": ddtree},
            "best_fixed": "dflash L=3", "dflash_over_ar": dflash / ar, "dflash_over_best": dflash / max(ar, best),
            "ddtree_over_ar": ddtree / ar}


def test_goals_name_each_bar_a_run_missed():
    met = {"levels": [_level(1, 100, 140, 160, 150), _level(8, 50, 60, 59, 51), _level(16, 40, 38, 41, 40)]}
    assert goals(met) == []
    missed = {"levels": [_level(1, 100, 140, 140, 150), _level(8, 50, 60, 55, 49), _level(16, 40, 38, 39, 40)]}
    assert goals(missed) == [
        "c=1: dflash 1.40x ar < 1.5",
        "c=8: dflash 0.917x max(ar, best fixed) < 0.97",
        "c=8: ddtree 0.98x ar < 1.0",
        "c=16: dflash 0.97x ar < 1.0",  # 0.975
    ]


def test_each_repeat_is_read_against_its_own_best_curve():
    """Repeat 0: dflash 90 against the best of ar 60 and L=3 100; repeat 1: 120 against ar 80 and L=3 100."""
    def runs_of(*p50s):
        return [type("Level", (), {"tok_s_user": type("D", (), {"p50": v})()})() for v in p50s]

    runs = {"dflash": runs_of(90, 120), "ar": runs_of(60, 80), "dflash L=3": runs_of(100, 100)}
    assert repeat_ratios(runs, ["ar", "dflash L=3"]) == pytest.approx([0.9, 1.2])


def test_the_readme_table_is_the_printed_one():
    result = {"levels": [dict(_level(1, 100, 140, 160, 150), dflash_zero_share=0.03,
                              dflash_over_best_repeats=[1.2, 1.1, 1.15], dflash_over_best_mean=1.25),
                         dict(_level(16, 40, 38, 41, 40), dflash_zero_share=None)]}
    lines = markdown(result).splitlines()
    assert lines[0].startswith("| c | AR | best fixed | dflash |") and lines[1] == "|---|" + "---|" * 10
    assert lines[2] == "| 1 | 100.0 | 140.0 (L=3) | 160.0 | 1.60x | 1.143 | 1.100-1.200 | 1.250 | 3% | 150.0 | 1.50x |"
    assert lines[3].split(" | ")[6:9] == ["-", "-", "-"]  # a result from before these columns


@pytest.mark.slow
def test_a_tiny_served_run_gives_every_curve_at_every_level(tmp_path, capsys):
    pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
    sets = ["sweep.min_requests=4", "sweep.warmup_requests=0", "sweep.output_len=16", "sweep.output_len_range=0.5",
            "speculative.draft_len=auto"]
    argv = ["bench", "policy", "--levels", "1,2", "--repeats", "1", "--fixed", "3", "--work", str(tmp_path), "--json"]
    assert main(argv + [x for kv in sets for x in ("--set", kv)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["failed"] == 0 and [r["concurrency"] for r in res["levels"]] == [1, 2]
    for r in res["levels"]:
        assert set(r["tok_s_user_p50"]) == {"ar", "dflash L=3", "dflash", "ddtree"}
        assert all(v > 0 for v in r["tok_s_user_p50"].values())
        assert sum(r["dflash_draft_lens"].values()) > 0  # the server's counters were read
        assert len(r["dflash_over_best_repeats"]) == 1 and r["dflash_over_best_mean"] > 0
        assert set(r["tok_s_user_mean"]) == set(r["tok_s_user_p50"])
