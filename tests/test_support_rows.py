"""Every support row (recipe/support.py support_rows, docs/support.md's table and `recipes --support`)
that is marked runnable runs: a tiny random target of its architecture and a tiny drafter of its
variant go through `run --until deploy` on this CPU, at every precision the row lists (GPU
recipes stop where this machine cannot go on; quantized precisions run ModelOpt / our formats
here). A row marked not runnable is refused by `check`, naming why, and `run` writes nothing.

One checkpoint per architecture and per drafter variant for the module; tiny shapes. The float
precision of each row (and gpt-oss's MXFP4, served as shipped) is in the default suite; the
quantized ones are slow (ModelOpt calibration of every architecture), except the headline
recipe's gpt-oss NVFP4, run on its own test."""

import contextlib
import io
import json
import shutil

import pytest
import yaml

from checkpoints import DFLASH2, LAGUNA, make_drafter, make_target, mxfp4_experts, write_recipe
from trtllm_dflash.artifacts import Manifest, verify_input
from trtllm_dflash.cli import main
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.schema import FLOAT_FORMATS
from trtllm_dflash.recipe.support import BACKENDS, support_rows

pytestmark = pytest.mark.filterwarnings("ignore")
ROWS = support_rows()
DRAFTER_ARGS = {"dflash": {}, "dflash2": DFLASH2, "laguna": LAGUNA}
FAST = ["quantization.calib_samples=4", "quantization.calib_len=16"]


def _cases():
    """(row, gpu, precision) for every runnable row and every precision it lists on some GPU
    (the CPU where it lists one: what runs here end to end)."""
    out = []
    for row in ROWS:
        if row.why_not:
            continue
        seen = set()
        for gpu, formats in sorted(row.gpus.items(), key=lambda kv: kv[0] != "cpu"):
            for fmt in formats:
                if fmt in seen or (fmt == "fp32" and gpu != "cpu"):
                    continue
                seen.add(fmt)
                float_case = fmt == ("fp32" if "cpu" in row.gpus else "bf16")
                # gpt-oss NVFP4 runs in the default suite as the headline recipe (below)
                fast = float_case or (row.target, fmt) == ("gpt_oss", "mxfp4")
                marks = () if fast else (pytest.mark.slow,)
                out.append(pytest.param(row, gpu, fmt, marks=marks,
                                        id=f"{row.target}-{row.drafter}-{row.backend}-{gpu}-{fmt}"))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoints made on first use: ("target", arch) and ("drafter", variant) -> directory."""
    root, made = tmp_path_factory.mktemp("rows"), {}

    def get(kind: str, name: str):
        if (kind, name) not in made:
            path = root / f"{kind}-{name}"
            if kind == "target" and name == "gpt_oss-mxfp4":  # gpt-oss as published: MXFP4 experts
                shutil.copytree(get("target", "gpt_oss"), path)
                made[kind, name] = mxfp4_experts(path)
            else:
                made[kind, name] = (make_target(path, name) if kind == "target"
                                    else make_drafter(path, **DRAFTER_ARGS[name]))
        return made[kind, name]

    return get


def _cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def _recipe(tmp_path, models, target: str, drafter: str, backend: str, gpu: str, fmt: str):
    quantized = fmt not in FLOAT_FORMATS + ("mxfp4",)
    base = "fp32" if gpu == "cpu" else "bf16"
    q = {"target_weights": fmt, "activations": fmt if quantized else base, "kv_cache": base, "drafter": base}
    source = f"{target}-mxfp4" if fmt == "mxfp4" and target == "gpt_oss" else target
    return write_recipe(tmp_path / "r.yaml", models("target", source), models("drafter", drafter), gpu=gpu,
                        backend=backend, quantization=q)


@pytest.mark.parametrize("row,gpu,fmt", _cases())
def test_every_runnable_row_runs_until_deploy(tmp_path, models, row, gpu, fmt):
    path = _recipe(tmp_path, models, row.target, row.drafter, row.backend, gpu, fmt)
    rc, stdout, stderr = _cli("run", path, "--out", tmp_path / "run", "--until", "deploy", "--no-progress",
                              *[a for s in FAST for a in ("--set", s)])
    assert rc == 0, stdout + stderr
    recipe, spec = load_recipe(path, FAST), BACKENDS[row.backend]
    deployed = verify_input(tmp_path / "run/deploy", ("deploy",), recipe)
    stages = (["convert"] + (["quantize"] if recipe.quantization.quantizes else [])
              + (["build"] if spec.builds_engines else []))
    assert deployed.input["stage"] == stages[-1]
    for stage in stages:
        verify_input(tmp_path / "run" / stage, (stage,), recipe)
    assert Manifest.read(tmp_path / "run/convert").extra["layout"] == spec.layout
    if spec.triton_model == "llmapi":  # TensorRT-LLM loads the last stage's target
        model = yaml.safe_load((tmp_path / "run/deploy/model_repository/dflash/1/model.yaml").read_text())["model"]
        assert model == str((tmp_path / "run" / stages[-1] / "target").resolve())
        launch = json.loads((tmp_path / "run/deploy/trtllm_serve/launch.json").read_text())
        assert launch["single_node"][:2] == ["trtllm-serve", model]


@pytest.mark.parametrize("row", [r for r in ROWS if r.why_not], ids=lambda r: f"{r.target}-{r.drafter}-{r.backend}")
def test_every_row_not_marked_runnable_is_refused_by_check(tmp_path, models, row):
    spec = BACKENDS[row.backend]
    gpu = "cpu" if not spec.needs_gpu or spec.cpu_runs else "h100-sxm"
    path = _recipe(tmp_path, models, row.target, row.drafter, row.backend, gpu, "fp32" if gpu == "cpu" else "bf16")
    rc, _, err = _cli("check", path)
    assert rc == 2
    if row.backend in {b for b in BACKENDS if row.target not in _served(b)}:
        assert f"{row.backend} does not support {row.target} targets" in err
    else:
        assert f"drafter on the {row.backend} backend: {spec.drafter_gap(row.drafter)}" in err
    rc, _, _ = _cli("run", path, "--out", tmp_path / "run", "--until", "deploy", "--no-progress")
    assert rc == 2 and not (tmp_path / "run").exists()


def _served(backend: str) -> set[str]:
    from trtllm_dflash.recipe.support import architectures_of

    return set(architectures_of(backend))


def test_the_headline_recipe_runs_a_tiny_gpt_oss_until_deploy_and_prints_its_launch_lines(tmp_path):
    """recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml as shipped (8x B300, tp 8, NVFP4 target and
    FP8 KV through ModelOpt, block 10) on a tiny random gpt_oss shaped to split 8 ways, then
    `serve` prints the single-node trtllm-serve line and writes the Slurm batch script."""
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"
    wide = dict(num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=8192)
    target = make_target(tmp_path / "t", "gpt_oss", num_local_experts=8, **wide)
    drafter = make_drafter(tmp_path / "d", block_size=10, **wide)
    sets = [f"target.source={target}", f"drafter.source={drafter}", "target.arch=null", "drafter.arch=null", *FAST]
    sets = [a for s in sets for a in ("--set", s)]
    run = tmp_path / "run"
    rc, stdout, stderr = _cli("run", recipe, "--out", run, "--until", "deploy", "--no-progress", *sets)
    assert rc == 0, stdout + stderr
    assert Manifest.read(run / "deploy").input["stage"] == "quantize"
    hf_quant = json.loads((run / "quantize/target/hf_quant_config.json").read_text())["quantization"]
    assert (hf_quant["quant_algo"], hf_quant["kv_cache_quant_algo"]) == ("NVFP4", "FP8")
    options = yaml.safe_load((run / "deploy/trtllm_serve/extra_llm_api_options.yaml").read_text())
    assert (options["tensor_parallel_size"], options["moe_expert_parallel_size"]) == (8, 8)
    assert options["speculative_config"]["max_draft_len"] == 9
    rc, stdout, stderr = _cli("serve", recipe, "--from", run / "deploy", "--api", "openai", *sets)
    served = str((run / "quantize/target").resolve())
    assert rc == 0 and stdout.split()[:2] == ["trtllm-serve", served], stdout + stderr
    job = tmp_path / "job.sbatch"
    rc, stdout, stderr = _cli("serve", recipe, "--from", run / "deploy", "--api", "openai", "--launcher", "srun",
                              "--registry", "nvcr.io", "--out", job, *sets)
    assert rc == 0, stdout + stderr
    script = job.read_text()
    assert "#SBATCH --nodes=1" in script and "#SBATCH --gpus-per-node=8" in script
    assert f"trtllm-llmapi-launch trtllm-serve {served} " in script and "nvcr.io#nvidia/tensorrt-llm/release:" in script


def _gaps():
    """(row, gpu, precision) where the GPU has the precision but the row does not list it."""
    from trtllm_dflash.recipe.hardware import hardware_catalog

    gpus = hardware_catalog()
    return [pytest.param(row, gpu, fmt, id=f"{row.target}-{row.drafter}-{row.backend}-{gpu}-{fmt}")
            for row in ROWS if not row.why_not and row.drafter == "dflash"
            for gpu, listed in row.gpus.items() for fmt in gpus[gpu].formats if fmt not in listed]


@pytest.mark.parametrize("row,gpu,fmt", _gaps())
def test_a_precision_a_row_does_not_list_is_refused_by_check(tmp_path, models, row, gpu, fmt):
    """e.g. FP8 / NVFP4 qwen3_moe on the reference backend (its TensorRT-LLM layout has no
    quantized MoE experts), MXFP4 of a target that does not ship it."""
    from trtllm_dflash.recipe.support import format_gap

    path = _recipe(tmp_path, models, row.target, row.drafter, row.backend, gpu, fmt)
    rc, _, err = _cli("check", path)
    assert rc == 2 and f"quantization.target_weights: {format_gap(row.target, row.backend, fmt)}" in err
