"""`run`: the whole pipeline on the FP8 CPU recipe, make-like, against a real tritonserver.

The server must decode the quantized model: its greedy text equals `generate --checkpoint
DIR/quantize`, and differs from the unquantized pair's (`generate --checkpoint DIR/convert`)
on at least one prompt.

The whole-pipeline runs are slow-marked (CI runs them after the default suite); the default run's
end to end is the embedded default's, convert to deploy to a served OpenAI request
(tests/serve/test_openai.py).
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from checkpoints import needs_modelopt, write_recipe
from trtllm_dflash.artifacts import Manifest, verify_input
from trtllm_dflash.cli import main
from trtllm_dflash.pipeline import StopHere, run, staleness
from trtllm_dflash.prompts.sources import load_prompts
from trtllm_dflash.recipe import load_recipe

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")
pytestmark = needs_modelopt

ROOT = Path(__file__).resolve().parents[1]
FP8 = ROOT / "recipes/cpu/tiny-pystd-fp8.yaml"
# One concurrency level, five requests of 32 tokens: enough prompts to see the quantized model.
FAST = ["sweep.concurrency=[1]", "sweep.min_requests=4", "sweep.warmup_requests=0", "sweep.output_len=32",
        "quantization.calib_samples=16", "quantization.calib_len=128"]


def quiet(_):
    pass


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    recipe = load_recipe(FP8, FAST)
    return recipe, out, run(recipe, out, progress=False, say=quiet)


def _generate(checkpoint: Path, prompt: str, n: int) -> list[int]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", prompt, "--max-new-tokens", str(n),
                     "--json"]) == 0
    return json.loads(buf.getvalue())["tokens"]


@pytest.mark.slow  # the whole FP8 pipeline behind tritonserver
def test_served_text_is_the_quantized_models(fp8_run):
    from transformers import AutoTokenizer

    recipe, out, stages = fp8_run
    assert [(s.stage, s.status) for s in stages] == [
        ("convert", "ran"), ("quantize", "ran"), ("deploy", "ran"), ("sweep", "ran")]
    deployed = Manifest.read(out / "deploy")
    assert deployed.extra["artifact"] == "../quantize"  # relative to the deploy output
    # The acceptance guardrail ran on the shipped FP8 quantization and passed (quantize/guard.py).
    g = Manifest.read(out / "quantize").extra["acceptance_guard"]
    assert g["passed"] and g["prompts"] == 16 and g["tau_before"] > 1.5 and g["drop"] <= g["max_drop"] == 0.10
    sw = recipe.sweep
    prompts = load_prompts(sw.dataset, sw.requests_at(1) + sw.warmup_requests, sw.input_len, sw.seed)
    rows = [json.loads(line) for line in (out / "sweep/results.jsonl").read_text().splitlines()]
    # AR, DFlash and DDTree from the one server: the same greedy text for every prompt.
    assert sorted({r["curve"] for r in rows}) == ["ar", "ddtree", "dflash"]
    assert len(rows) == 3 * sw.requests_at(1) and not any(r["error"] for r in rows)
    texts = {}
    for r in rows:
        texts.setdefault(r["request_id"], set()).add(r["text"])
    assert all(len(t) == 1 for t in texts.values()), "the curves decoded different text"
    rows = [r for r in rows if r["curve"] == "ddtree"]
    tok = AutoTokenizer.from_pretrained(out / "quantize" / "tokenizer")
    differs = 0
    for row in rows:
        prompt = prompts[row["request_id"] % len(prompts)]
        quantized = tok.decode(_generate(out / "quantize", prompt, sw.output_len))
        assert row["text"] == quantized, f"request {row['request_id']}: served text is not the quantized model's"
        differs += quantized != tok.decode(_generate(out / "convert", prompt, sw.output_len))
    assert differs >= 1, "the quantized and unquantized pairs agree on every prompt: the test cannot tell them apart"


@pytest.mark.slow  # the whole FP8 pipeline behind tritonserver
def test_demo_prints_the_curves_and_the_headline_of_a_current_run(fp8_run, capsys):
    """`demo` on a pipeline directory that is up to date runs no stage and prints the check, the
    plan, every curve's rows and the headline ratios from the sweep's own files. (Defined before
    the rerun test, which changes the shared run's quantize output: pytest keeps file order.)"""
    recipe, out, _ = fp8_run
    assert main(["demo", str(FP8), *[a for f in FAST for a in ("--set", f)], "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "stages run: none (all up to date)" in text
    rows = [line.split() for line in text.splitlines()]
    assert any(r[:2] == ["AR", "1"] for r in rows) and any(r[:2] == ["DFlash", "1"] for r in rows)
    h = json.loads((out / "sweep" / "headline.json").read_text())["headline"]["dflash_vs_ar"]
    best = h["max_tok_s_user"]
    assert f"DFlash {best['dflash']:.1f}, AR {best['ar']:.1f}" in text  # the headline as the sweep wrote it
    assert f"c=1: {h['tok_s_user_ratio_at_equal_label']['1']:.2f}x" in text
    assert "…" not in text


@pytest.mark.slow  # the whole FP8 pipeline behind tritonserver
def test_rerun_skips_everything_and_a_drafter_format_change_reruns_from_quantize(fp8_run):
    recipe, out, _ = fp8_run
    said = []
    again = run(recipe, out, progress=False, say=said.append)
    assert [(s.stage, s.status) for s in again] == [(s, "skipped") for s in ("convert", "quantize", "deploy", "sweep")]
    assert not any("serve:" in line for line in said), "a current sweep must not start a server"

    nvfp4 = load_recipe(FP8, FAST + ["quantization.drafter=nvfp4"])
    changed = run(nvfp4, out, until="deploy", progress=False, say=quiet)
    assert [(s.stage, s.status) for s in changed] == [("convert", "skipped"), ("quantize", "ran"), ("deploy", "ran")]
    assert changed[1].why == "recipe changed: quantization.drafter"
    levels = {"levels": [1]}
    assert staleness("sweep", out / "sweep", nvfp4, out / "deploy", levels) == "recipe changed: quantization.drafter"
    assert staleness("sweep", out / "sweep", recipe, out / "deploy", levels) == f"its input {out / 'deploy'} changed"
    assert Manifest.read(out / "quantize").extra["quantization"]["drafter"] == "nvfp4"


@pytest.fixture()
def tiny_recipe(tmp_path, tiny_pair):
    # A short calibration: these tests read what the stages write, not what FP8 does to the text.
    return write_recipe(tmp_path / "r.yaml", *tiny_pair, fmt="fp8", quantization={"calib_samples": 4, "calib_len": 32})


def _main(capsys, *args) -> tuple[int, str, str]:
    """The command line in this process: what a subprocess adds is its imports (about 10 s each on
    2 busy cores), and the exit code and the one stderr line are main()'s own."""
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_bad_from_directories_get_one_line_naming_the_field_or_file(tmp_path, tiny_recipe, capsys):
    out = tmp_path / "p"
    recipe = load_recipe(tiny_recipe)
    run(recipe, out, until="deploy", progress=False, say=quiet)
    cases = [
        (("quantize", tiny_recipe, "--from", out / "deploy", "--out", tmp_path / "q"),
         "manifest field stage is 'deploy'; expected a convert output"),
        (("deploy", tiny_recipe, "--set", "parallel.tp=2", "--from", out / "quantize", "--out", tmp_path / "d"),
         "manifest field recipe_fields.parallel.tp is 1, recipe 'tiny-test' has 2"),
        (("serve", tiny_recipe, "--from", tmp_path, "--set", "serve.http_port=1"),
         "no manifest.json; not a finished trtllm-dflash stage output"),
    ]
    for args, message in cases:
        rc, _, err = _main(capsys, *args)
        assert rc == 2 and err.strip().splitlines() == [f"error: {err.strip().removeprefix('error: ')}"], err
        assert message in err, err
    (out / "quantize" / "target" / "rank0.safetensors").write_bytes(b"tampered")
    rc, _, err = _main(capsys, "deploy", tiny_recipe, "--from", out / "quantize", "--out", tmp_path / "d2")
    assert rc == 2 and "file target/rank0.safetensors does not match its checksum in manifest.json" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "q").exists() and not (tmp_path / "d").exists() and not (tmp_path / "d2").exists()


def test_a_rerun_keeps_an_edited_config_pbtxt_beside_the_new_one(tmp_path):
    """config.pbtxt is edited in place (docs/serving.md); a rerun of deploy writes the recipe's
    again and keeps the user's edit beside it, saying so, never dropping it."""
    recipe, out, said = load_recipe(None), tmp_path / "run", []
    run(recipe, out, until="deploy", progress=False, say=quiet)
    config = out / "deploy/model_repository/dflash/config.pbtxt"
    fresh = config.read_text()
    config.write_text(fresh.replace('key: "torch_threads"\n  value {\n    string_value: "0"',
                                    'key: "torch_threads"\n  value {\n    string_value: "1"'))
    edited = config.read_text()
    assert edited != fresh
    run(recipe, out, until="deploy", progress=False, say=said.append)  # up to date: the edit stands
    assert config.read_text() == edited and "deploy: skipped (up to date" in said[-1]
    run(recipe, out, until="deploy", force="deploy", progress=False, say=said.append)
    kept = out / "deploy/model_repository/dflash/config.pbtxt.edited"
    assert config.read_text() == fresh and kept.read_text() == edited
    assert said[-1] == (f"deploy: model_repository/dflash/config.pbtxt had been edited; the new one is written from "
                        f"the recipe, your edit is kept as {kept} (apply it again)")
    verify_input(out / "deploy", ("deploy",), recipe)  # the kept copy is no file of the output's


@pytest.mark.slow
def test_kill_9_during_convert_and_quantize_then_run_again_finishes(tmp_path, tiny_recipe):
    """A real kill -9 at points inside convert and quantize: no directory ever passes as finished
    before it is, and the next `run` completes."""
    out = tmp_path / "p"
    for marker, delay in (("convert: running", 0.3), ("quantize: running", 1.5)):
        proc = subprocess.Popen([sys.executable, "-m", "trtllm_dflash", "run", str(tiny_recipe), "--out", str(out),
                                 "--until", "quantize", "--no-progress"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            for line in proc.stdout:
                if marker in line:
                    time.sleep(delay)
                    break
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stage in ("convert", "quantize"):
            if (out / stage).exists():  # only ever a finished output
                verify_input(out / stage, (stage,), load_recipe(tiny_recipe))
    # The next run, in this process: a fresh `trtllm-dflash run` costs its imports (ModelOpt's
    # alone about 8 s) and proves nothing more about what the killed runs left behind.
    again = run(load_recipe(tiny_recipe), out, until="quantize", progress=False, say=quiet)
    assert [s.stage for s in again] == ["convert", "quantize"]
    for stage in ("convert", "quantize"):
        verify_input(out / stage, (stage,), load_recipe(tiny_recipe))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "leftovers of the killed runs remain"


def test_stages_for_another_machine_stop_the_run_with_the_command(tmp_path, tiny_pair, capsys):
    engine = load_recipe(write_recipe(tmp_path / "e.yaml", *tiny_pair, fmt="bf16", gpu="h100-sxm", backend="engine"))
    with pytest.raises(StopHere, match=r"serve: the engine backend serves on 1x h100-sxm"):
        run(engine, tmp_path / "e", progress=False, say=quiet)
    assert (tmp_path / "e" / "convert" / "manifest.json").exists()  # what runs here did run
    # No TensorRT-LLM here: build wrote its dry-run plan and deploy took it.
    assert Manifest.read(tmp_path / "e" / "build").extra["dry_run"] is True
    assert Manifest.read(tmp_path / "e" / "deploy").input["stage"] == "build"
    torch_recipe = write_recipe(tmp_path / "t.yaml", *tiny_pair, fmt="bf16", gpu="h100-sxm", backend="pytorch")
    rc, stdout, _ = _main(capsys, "run", torch_recipe, "--out", tmp_path / "t", "--no-progress")
    assert rc == 3
    assert stdout.strip().splitlines()[-1].startswith("stopped before serve: the pytorch backend serves on 1x h100-sxm")
    assert f"trtllm-dflash serve {torch_recipe} --from {tmp_path / 't' / 'deploy'} --run" in stdout.replace("\n", "")
    model = (tmp_path / "t/deploy/model_repository/dflash/1/model.yaml").read_text()
    assert f"model: {(tmp_path / 't' / 'convert').resolve()}/target" in model  # the recipe does not quantize
