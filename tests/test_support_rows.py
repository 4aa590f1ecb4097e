"""Every support row (recipe/support.py support_rows, the README's table and `recipes --support`)
that is marked runnable runs: a tiny random target of its architecture and a tiny drafter of its
variant go through `run --until deploy` on this CPU, at every precision the row lists (GPU
recipes stop where this machine cannot go on; quantized precisions run ModelOpt / our formats
here). A row marked not runnable is refused by `check`, naming why, and `run` writes nothing.

One checkpoint per architecture and per drafter variant for the module; tiny shapes. The float
precision of each row is in the default suite; the quantized ones are slow (ModelOpt calibration
of every architecture), except gpt-oss NVFP4, the headline deployment's precision."""

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
                fast = float_case or (row.target, fmt) in (("gpt_oss", "nvfp4"), ("gpt_oss", "mxfp4"))
                marks = () if fast else (pytest.mark.slow,)
                out.append(pytest.param(row, gpu, fmt, marks=marks, id=f"{row.target}-{row.drafter}-{row.backend}-{gpu}-{fmt}"))
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
                made[kind, name] = make_target(path, name) if kind == "target" else make_drafter(path, **DRAFTER_ARGS[name])
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
    source = "gpt_oss-mxfp4" if fmt == "mxfp4" else target
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
    stages = ["convert"] + (["quantize"] if recipe.quantization.quantizes else []) + (["build"] if spec.builds_engines else [])
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
