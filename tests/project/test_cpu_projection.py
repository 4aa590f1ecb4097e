"""The projection of the CPU recipe against real CPU sweeps (reference backend behind tritonserver,
the sweep's gRPC load generator), for tokens/s/user and tokens/s/GPU at every level.

The cpu "GPU" has no catalog rates: its `measured` block in recipe/catalog/hardware.yaml comes from
`trtllm_dflash.project.calibrate` on the 2-core machine this package is developed on (pass rates
from the reference backend in process; per-pass and per-sequence serving costs from probes of a
running server at concurrency 3 and 6 with prompts of another seed: levels this test does not
compare, so every level below is a prediction, none a fitted point). tests/project/data/ keeps the
calibration and the sweep that ran right after it (same machine, same hour): the default run
checks the projection against that sweep; the slow test calibrates and sweeps afresh.

tokens/s/user is compared pooled over a level's requests (1 / mean TPOT): the projection has one
tau for every request, while the sweep's median request also moves with the spread of per-request
tau (report.measured_vs_projected).

The fresh test checks the two halves of a projection apart. Acceptance: the sweep's tau, averaged
over the levels, within 10% of the measured profile's (each level's tau is fixed by the seeded
prompts it draws, 5 to 40 requests, and spreads 2.89-3.71 around the profile's 3.29; their mean
is 3.22). Timing: the rates at each level's own tau within 40%. A fresh calibration and the sweep
after it are a minute apart on a shared 2-core machine whose speed moves between them and within
the sweep (the fitted GFLOP/s read 32 and 46 in two runs back to back): over eight runs the
errors at the measured tau reached 29%, those at the profile's tau 40% (c=2, whose prompts
accept 12% less than the profile; docs/projections.md). The bound cannot see a timing error
smaller than that noise; the kept sweep's 30% check is the finer one.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trtllm_dflash.project import acceptance
from trtllm_dflash.project.projection import project
from trtllm_dflash.project.report import measured_vs_projected, served_curve
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.hardware import Measured, hardware_catalog
from trtllm_dflash.sweep.metrics import LevelSummary

DATA = Path(__file__).resolve().parent / "data" / "cpu-tiny-pystd-sweep.json"
TOLERANCE = 0.30  # the kept sweep against its own calibration
FRESH_TOLERANCE = 0.40  # a fresh calibration and sweep, at the measured tau (the docstring says why)
TAU_TOLERANCE = 0.10  # the fresh test: the mean of the levels' tau against the profile's
# The embedded recipe as the comparison runs it: DFlash (the recipe's DDTree budget off: the
# projection does not model trees) at 15 drafts every round (what the recipe ran when the kept
# sweep was recorded; `auto` is projected as the best length per level, which it did not run),
# levels 1-8, few requests per level.
OVERRIDES = ["speculative.ddtree_budget=null", "speculative.draft_len=[]", "sweep.concurrency=[1,2,4,8]",
             "sweep.min_requests=4", "sweep.warmup_requests=1"]


def served_rows(curves: dict) -> list:
    """The rows of the server's own decoding in a sweep directory's curves (report.read_measured)."""
    return curves.get("") or curves.get("dflash") or next(iter(curves.values()))


def errors(rows, at: str = ""):
    """(tok/s/user, tok/s/GPU) relative errors per level; at="_at_measured_tau": at the level's own tau."""
    return {r["concurrency"]: (round(r[f"tok_s_user_error{at}"], 3), round(r[f"tok_s_gpu_error{at}"], 3))
            for r in rows}


def test_catalog_cpu_rates_are_the_stored_calibration():
    data = json.loads(DATA.read_text())
    assert hardware_catalog()["cpu"].measured == Measured(**data["calibration"]["measured"])
    assert data["overrides"] == OVERRIDES


def test_cpu_projection_matches_the_sweep_measured_with_the_calibration():
    data = json.loads(DATA.read_text())
    r = load_recipe(None, data["overrides"])
    measured = [LevelSummary.from_json(d) for d in data["sweep"]]
    proj = project(r, acceptance.published(r))  # catalog rates, the shipped pair's measured profile
    rows = measured_vs_projected(proj, measured, served_curve(r)[0])
    assert [row["concurrency"] for row in rows] == [1, 2, 4, 8]
    bad = {c: e for c, e in errors(rows).items() if max(abs(e[0]), abs(e[1])) > TOLERANCE}
    assert not bad, f"(tok/s/user, tok/s/GPU) relative errors beyond {TOLERANCE:.0%}: {bad}; all: {errors(rows)}"


def test_errors_at_the_measured_tau_leave_the_acceptance_out():
    """A sweep whose acceptance halved while its rounds took as long (every rate halves with tau)
    has the same errors at its measured tau, and other raw errors."""
    data = json.loads(DATA.read_text())
    r = load_recipe(None, data["overrides"])
    measured = [LevelSummary.from_json(d) for d in data["sweep"]]
    halved = [replace(m, tau=m.tau / 2, output_tok_s_per_gpu=m.output_tok_s_per_gpu / 2,
                      tpot_s=replace(m.tpot_s, mean=m.tpot_s.mean * 2)) for m in measured]
    proj = project(r, acceptance.published(r))
    before, after = (measured_vs_projected(proj, ms, served_curve(r)[0]) for ms in (measured, halved))
    for b, a in zip(before, after):
        assert a["tok_s_user_error"] == pytest.approx(2 * (1 + b["tok_s_user_error"]) - 1)
        for key in ("tok_s_user_error_at_measured_tau", "tok_s_gpu_error_at_measured_tau"):
            assert a[key] == pytest.approx(b[key], abs=1e-9)


def test_project_calibrate_writes_what_it_measured(tmp_path, monkeypatch, capsys):
    """--calibrate wiring (the measurement itself runs in the slow test): the projection uses the
    calibration, and calibration.json records it."""
    from trtllm_dflash.cli import main
    from trtllm_dflash.project import calibrate

    fake = calibrate.Calibration(Measured(source="fake", memory_bandwidth_gbs=1.0, tensor_gflops=1.0,
                                          layer_overhead_us=0, step_overhead_ms=0, seq_overhead_us=0), {"x": 1})
    monkeypatch.setattr(calibrate, "calibrate", lambda recipe, url=None: fake)
    assert main(["project", "--calibrate", "--out", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "measured: fake" in data["rates"]
    assert json.loads((tmp_path / "calibration.json").read_text())["measured"]["source"] == "fake"


@pytest.mark.slow
@pytest.mark.alone  # it times this machine: another test beside it skews the comparison
def test_cpu_projection_matches_a_fresh_sweep(tmp_path):
    """Calibrate on this machine (passes, then probes of a served deployment), then sweep it with
    `pipeline.run` (convert, deploy, serve behind tritonserver, sweep) and compare."""
    from trtllm_dflash import pipeline
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.launch.server import Endpoints, TritonServer
    from trtllm_dflash.project.calibrate import calibrate
    from trtllm_dflash.project.report import read_measured
    from trtllm_dflash.project.stepmodel import Deployment, StepModel

    r = load_recipe(None, OVERRIDES)
    def quiet(line):
        pass
    pipeline.run(r, tmp_path, until="deploy", progress=False, say=quiet)
    endpoints = Endpoints.free()
    with TritonServer(tmp_path / "deploy" / REPOSITORY, endpoints):
        cal = calibrate(r, endpoints.grpc_url)
    pipeline.run(r, tmp_path, progress=False, say=quiet)
    measured = served_rows(read_measured(tmp_path / "sweep"))
    dep = Deployment.from_recipe(r)
    model = StepModel(replace(dep, gpu=dep.gpu.model_copy(update={"measured": cal.measured})))
    prof = acceptance.measure(r, prompts=16, prompt_len=r.sweep.input_len, max_new_tokens=r.sweep.output_len)
    proj = project(r, prof, model=model)
    rows = measured_vs_projected(proj, measured, served_curve(r)[0])
    assert [row["concurrency"] for row in rows] == [1, 2, 4, 8]
    taus = {row["concurrency"]: (round(row["measured_tau"], 2), round(row["projected_tau"], 2)) for row in rows}
    mean_tau = sum(row["measured_tau"] for row in rows) / len(rows)
    assert mean_tau == pytest.approx(rows[0]["projected_tau"], rel=TAU_TOLERANCE), f"tau (measured, projected): {taus}"
    timing = errors(rows, at="_at_measured_tau")
    bad = {c: e for c, e in timing.items() if max(abs(e[0]), abs(e[1])) > FRESH_TOLERANCE}
    assert not bad, (f"(tok/s/user, tok/s/GPU) relative errors at the measured tau beyond {FRESH_TOLERANCE:.0%}: "
                     f"{bad}; all: {timing}; at the projected tau: {errors(rows)}; tau (measured, projected): {taus}; "
                     f"calibration: {json.dumps(cal.to_json())}")
