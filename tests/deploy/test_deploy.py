"""deploy: generated Triton repositories (and the pytorch backend's trtllm-serve files) are
pinned by golden files, and serve the artifact deploy was given (`--from`) and nothing else.

To accept an intended change, regenerate the goldens with
`python tests/deploy/test_deploy.py --regenerate` and review the diff.
"""

import sys
from pathlib import Path

import pytest
import yaml

from trtllm_dflash.artifacts import Manifest, atomic_stage_dir, manifest_sha256, verify_input
from trtllm_dflash.deploy.llmapi import model_yaml
from trtllm_dflash.deploy.repository import deploy
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import list_recipes, load_recipe
from trtllm_dflash.recipe.stages import input_stage

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
ARTIFACT, SHA, DEPLOY = "<ARTIFACT>", "<MANIFEST_SHA256>", "<DEPLOY>"

PYTORCH_RECIPES = {"gptoss": "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml",
                   "qwen3coder": "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"}
PYTORCH_FILES = {"config.pbtxt": "model_repository/dflash/config.pbtxt",
                 "model.yaml": "model_repository/dflash/1/model.yaml",
                 "extra_llm_api_options.yaml": "trtllm_serve/extra_llm_api_options.yaml",
                 "launch.json": "trtllm_serve/launch.json",
                 # NVIDIA Dynamo's TensorRT-LLM worker (deploy/dynamo.py)
                 "dynamo.engine_args.yaml": "dynamo/engine_args.yaml", "dynamo.launch.json": "dynamo/launch.json"}
CASES = {
    # golden name: (recipe, overrides, file inside the deploy output)
    "reference.config.pbtxt": ("recipes/cpu/tiny-pystd.yaml", (), "model_repository/dflash/config.pbtxt"),
    "reference.recipe.yaml": ("recipes/cpu/tiny-pystd.yaml", (), "model_repository/dflash/1/recipe.yaml"),
    "engine.config.pbtxt": ("recipes/hopper/h100-qwen3-8b-fp8.yaml", (), "model_repository/dflash/config.pbtxt"),
    # tensorrtllm_backend's interface beside dflash (deploy/dialect.py), the same on both backends.
    **{f"dialect.{m}.config.pbtxt": ("recipes/cpu/tiny-pystd.yaml", (), f"model_repository/{m}/config.pbtxt")
       for m in ("ensemble", "tensorrt_llm_bls", "tensorrt_llm")},
    # Every pytorch recipe, at the TensorRT-LLM version it names (1.3.0rc29) and at 1.4.0rc1.
    **{f"pytorch-{key}.{name}": (path, (), inner) for key, path in PYTORCH_RECIPES.items()
       for name, inner in PYTORCH_FILES.items()},
    **{f"pytorch-{key}-1.4.{name}": (path, ("backend.trtllm_version=1.4.0rc1",), PYTORCH_FILES[name])
       for key, path in PYTORCH_RECIPES.items()
       for name in ("model.yaml", "extra_llm_api_options.yaml", "dynamo.engine_args.yaml", "dynamo.launch.json")},
}
LAYOUT = {"reference": "trtllm", "pytorch": "hf", "engine": None}


def artifact(recipe, root: Path, stage: str | None = None) -> Path:
    """A stand-in for the stage output deploy takes (deploy reads manifests, never weights)."""
    stage = stage or input_stage(recipe, "deploy")
    layout = LAYOUT[recipe.backend.name]
    with atomic_stage_dir(root / stage,
                          Manifest.for_stage(stage, recipe, extra={"layout": layout} if layout else {})) as d:
        (d / "weights.safetensors").write_bytes(b"stand-in")
    return root / stage


def generate(name: str, tmp: Path) -> str:
    recipe_path, overrides, inner = CASES[name]
    recipe = load_recipe(ROOT / recipe_path, list(overrides))
    src = artifact(recipe, tmp)
    out = deploy(recipe, src, tmp / "out")
    text = (out / inner).read_text()
    text = text.replace(str(src.resolve()), ARTIFACT).replace(manifest_sha256(src), SHA)
    return text.replace(str(out.resolve()), DEPLOY)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_golden(name, tmp_path):
    assert generate(name, tmp_path) == (GOLDEN / name).read_text(), f"{name} differs from tests/deploy/golden/{name}"


def test_repository_layout_and_manifest(tmp_path):
    recipe = load_recipe(None)
    src = artifact(recipe, tmp_path)
    out = deploy(recipe, src, tmp_path / "repo")
    m = verify_input(out, ("deploy",), recipe)
    assert set(m.files) == {
        "model_repository/dflash/config.pbtxt",
        "model_repository/dflash/1/model.py",
        "model_repository/dflash/1/recipe.yaml",
        *(f"model_repository/{m}/{f}" for m in ("ensemble", "tensorrt_llm_bls", "tensorrt_llm")
          for f in ("config.pbtxt", "1/model.py")),
    }
    # The artifact by its path relative to the deploy output: the pair moves as a whole.
    assert m.input == {"stage": "convert", "path": "../convert", "manifest_sha256": manifest_sha256(src)}
    assert m.extra["artifact"] == "../convert" and m.input_dir(out) == src.resolve()
    # The deployed recipe is a valid recipe in its own right (it is what the server loads).
    deployed = out / "model_repository/dflash/1/recipe.yaml"
    assert load_recipe(deployed).sha256() == recipe.sha256()


def test_model_name_comes_from_the_recipe(tmp_path):
    recipe = load_recipe(None, ["serve.model_name=tiny"])
    out = deploy(recipe, artifact(recipe, tmp_path), tmp_path / "repo")
    assert 'name: "tiny"' in (out / "model_repository/tiny/config.pbtxt").read_text()


def test_deploy_takes_the_stage_before_it(tmp_path):
    fp8 = load_recipe(ROOT / "recipes/cpu/tiny-pystd-fp8.yaml")
    conv = artifact(fp8, tmp_path, "convert")
    with pytest.raises(UserError, match=r"manifest field stage is 'convert'; expected a quantize output"):
        deploy(fp8, conv, tmp_path / "a")
    engine = load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml")
    with pytest.raises(UserError, match=r"expected a build output"):
        deploy(engine, artifact(engine, tmp_path / "e", "quantize"), tmp_path / "b")
    # a convert output of another recipe
    plain = load_recipe(None)
    with pytest.raises(UserError, match=r"recipe_fields.checkpoint_dtype|recipe_fields.target.source"):
        deploy(plain, artifact(load_recipe(None, ["quantization.target_weights=bf16"]), tmp_path / "o"), tmp_path / "c")
    assert not any((tmp_path / n).exists() for n in "abc")


@pytest.mark.parametrize("path", [p for p in list_recipes() if load_recipe(p).backend.name == "pytorch"],
                         ids=lambda p: p.stem)
def test_pytorch_model_is_the_quantize_output(tmp_path, path):
    recipe = load_recipe(path)
    assert recipe.quantization.quantizes
    src = artifact(recipe, tmp_path)
    assert src.name == "quantize"
    out = deploy(recipe, src, tmp_path / "out")
    model = yaml.safe_load((out / "model_repository" / recipe.serve.model_name / "1/model.yaml").read_text())
    assert model["model"] == str(src.resolve() / "target")
    assert model["speculative_config"]["speculative_model"] == str(src.resolve() / "drafter")


def test_llmapi_yaml_maps_draft_bands(tmp_path):
    spec = model_yaml(load_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"),
                      tmp_path)["speculative_config"]
    assert spec["max_draft_len"] == 9 and spec["draft_len_schedule"] == {16: 9, 64: 7, 256: 3}
    assert spec["target_layer_ids"] == [1, 9, 17, 25, 33] and spec["attention_backend"] == "TRTLLM"


@pytest.mark.parametrize("bands, schedule", [
    ("[{max_concurrency: 16, draft_len: 9}]", {16: 9, 256: 1}),  # upstream's max_concurrency would mean 0 above 16
    ("[{max_concurrency: 16, draft_len: 9}, {max_concurrency: 64, draft_len: 0}]", {16: 9, 64: 1, 256: 1}),
    ("[{max_concurrency: 300, draft_len: 9}]", {300: 9}),
])
def test_pytorch_schedules_never_turn_drafting_off(tmp_path, bands, schedule):
    """NVIDIA/TensorRT-LLM PR #16888: a draft_len_schedule that resolves to 0 (above its last key,
    a 0 band, or `max_concurrency`, which upstream turns into such a schedule) stops DFlash's
    drafter state from being refreshed and collapses acceptance once drafting resumes. Deployed
    schedules floor at 1 and reach max_batch_size (256), and `check` says so."""
    from trtllm_dflash.recipe.rules import check

    recipe = load_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", [f"speculative.draft_len={bands}"])
    spec = model_yaml(recipe, tmp_path)["speculative_config"]
    assert spec["draft_len_schedule"] == schedule and "max_concurrency" not in spec
    assert spec["max_draft_len"] == 9 and min(spec["draft_len_schedule"].values()) >= 1
    warned = [i for i in check(recipe) if "PR #16888" in i.message]
    assert len(warned) == (schedule != {300: 9}) and all(i.level == "warning" for i in warned)


# DFlashDecodingConfig fields per TensorRT-LLM line, restated here from upstream on purpose (a
# second copy that must agree with trtllm_dflash/deploy/llmapi.py). Source of each list: the
# API reference of tensorrt_llm.llmapi.DFlashDecodingConfig (rendered from
# tensorrt_llm/llmapi/llm_args.py) of the release named.
DECODING_BASE = {"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency",
                 "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
                 "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty"}
UPSTREAM_DFLASH_FIELDS = {
    "1.3": ("1.3.0rc27 llm-api/reference/DFlashDecodingConfig (tensorrt_llm/llmapi/llm_args.py)",
            DECODING_BASE | {"mask_token_id", "target_layer_ids", "decoding_type", "attention_backend"}),
    "1.4": ("1.4.0rc1 llm-api/reference/DFlashDecodingConfig (tensorrt_llm/llmapi/llm_args.py)",
            DECODING_BASE | {"moe_backend", "spec_dec_variant", "mask_token_id", "target_layer_ids",
                             "context_recompute_tail", "decoding_type", "attention_backend",
                             "skip_ctx_buffer_budget_check"}),
}


def test_field_tables_are_upstreams():
    from trtllm_dflash.deploy.llmapi import DFLASH_FIELDS
    from trtllm_dflash.recipe.rules import PYTORCH_TRTLLM_LINES

    assert set(DFLASH_FIELDS) == set(UPSTREAM_DFLASH_FIELDS) == set(PYTORCH_TRTLLM_LINES)
    for line, (source, fields) in UPSTREAM_DFLASH_FIELDS.items():
        assert DFLASH_FIELDS[line].fields == fields, source
        assert "llm_args.py" in DFLASH_FIELDS[line].source
    # The 1.3.0rc27 reference has FA4; earlier 1.3 builds do not (recipe/trtllm_api.py: since rc27).
    assert set(DFLASH_FIELDS["1.3"].attention_backends) == set(DFLASH_FIELDS["1.4"].attention_backends) == {
        "VANILLA", "TRTLLM", "FA4"}


@pytest.mark.parametrize("version", ["1.3.0rc29", "1.3.0rc27", "1.4.0rc1", "1.4.0rc4"])
@pytest.mark.parametrize("key", sorted(PYTORCH_RECIPES))
def test_every_speculative_key_is_a_field_of_the_chosen_version(tmp_path, key, version):
    from trtllm_dflash.deploy.llmapi import DFLASH_FIELDS

    recipe = load_recipe(ROOT / PYTORCH_RECIPES[key], [f"backend.trtllm_version={version}"])
    spec = model_yaml(recipe, tmp_path)["speculative_config"]
    line = version[:3]
    _, fields = UPSTREAM_DFLASH_FIELDS[line]
    assert set(spec) <= fields, f"{sorted(set(spec) - fields)} are not DFlashDecodingConfig fields in {version}"
    # VANILLA, the default, is not written (releases before PR #16914 have no attention_backend).
    attention = spec.get("attention_backend", "VANILLA")
    assert attention in DFLASH_FIELDS[line].attention_backends
    assert attention == ("TRTLLM" if recipe.gpu.is_blackwell else "VANILLA")


def test_prefix_reuse_follows_the_version_and_the_target():
    qwen = ROOT / PYTORCH_RECIPES["qwen3coder"]
    old = model_yaml(load_recipe(qwen), Path("/a"))
    new = model_yaml(load_recipe(qwen, ["backend.trtllm_version=1.4.0rc1"]), Path("/a"))
    # 1.3: a prefix-cache hit would starve the drafter, nothing to fix it -> reuse off.
    assert old["kv_cache_config"]["enable_block_reuse"] is False
    assert "context_recompute_tail" not in old["speculative_config"]
    # 1.4: reuse on, a recompute tail keeps the drafter's context; chunked prefill (the V1 gate).
    assert new["kv_cache_config"]["enable_block_reuse"] is True and new["enable_chunked_prefill"] is True
    assert new["speculative_config"]["context_recompute_tail"] > 0
    # Sliding-window targets: the tail does not apply, reuse stays off even on 1.4.
    oss = model_yaml(load_recipe(ROOT / PYTORCH_RECIPES["gptoss"], ["backend.trtllm_version=1.4.0rc1"]), Path("/a"))
    assert oss["kv_cache_config"]["enable_block_reuse"] is False
    assert "context_recompute_tail" not in oss["speculative_config"]


@pytest.mark.parametrize("version,message", [
    ("1.5.0",
     r"backend.trtllm_version: 1.5.0: no DFlashDecodingConfig field table for TensorRT-LLM 1.5; known: 1.3.x, 1.4.x"),
    ("2.0.0", r"known: 1.3.x, 1.4.x"),
    ("1.2.1", r"needs TensorRT-LLM >= 1.3"),
])
def test_unknown_versions_are_refused_with_the_known_ones(version, message):
    from trtllm_dflash.recipe.schema import RecipeError

    with pytest.raises(RecipeError, match=message):
        load_recipe(ROOT / PYTORCH_RECIPES["gptoss"], [f"backend.trtllm_version={version}"])


def test_unknown_version_refused_by_deploy_too(tmp_path):
    # deploy also refuses a recipe that skipped the rules (the Triton model loads them that way).
    recipe = load_recipe(ROOT / PYTORCH_RECIPES["gptoss"], ["backend.trtllm_version=1.9.0"], check_rules=False)
    with pytest.raises(UserError, match=r"backend.trtllm_version: 1.9.0: .* known: 1.3.x, 1.4.x"):
        model_yaml(recipe, tmp_path)


def test_drafter_stays_bf16_and_the_first_band_is_the_longest():
    from trtllm_dflash.recipe.schema import RecipeError

    path = ROOT / PYTORCH_RECIPES["qwen3coder"]
    with pytest.raises(RecipeError, match=r"quantization.drafter: fp8: TensorRT-LLM's native DFlash loads only BF16"):
        load_recipe(path, ["quantization.drafter=fp8"])
    with pytest.raises(RecipeError, match=r"speculative.draft_len.1.draft_len: 15 > the first band's 9"):
        load_recipe(path, ["speculative.draft_len=[{max_concurrency: 4, draft_len: 9}, "
                           "{max_concurrency: 32, draft_len: 15}]"])


@pytest.mark.parametrize("key", sorted(PYTORCH_RECIPES))
def test_triton_config_agrees_with_model_yaml_and_upstreams_interface(tmp_path, key):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    recipe = load_recipe(ROOT / PYTORCH_RECIPES[key])
    out = deploy(recipe, artifact(recipe, tmp_path), tmp_path / "out")
    model_dir = out / "model_repository" / recipe.serve.model_name
    cfg = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    triton = yaml.safe_load((model_dir / "1/model.yaml").read_text())["triton_config"]
    # Auto-complete is off on our launch line: both must be in config.pbtxt, equal to model.yaml's.
    assert cfg.model_transaction_policy.decoupled is True is triton["decoupled"]
    assert cfg.max_batch_size == 0 == triton["max_batch_size"]
    # The outputs upstream's model.py sends when sampling_param_return_perf_metrics is set.
    perf = {"kv_cache_reused_block", "kv_cache_hit_rate", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
            "kv_cache_missed_block", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
            "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}
    outputs = {o.name for o in cfg.output}
    assert perf | {"text_output", "finish_reason", "stop_reason", "cumulative_logprob"} == outputs
    assert {"sampling_param_return_perf_metrics", "streaming", "text_input"} <= {i.name for i in cfg.input}


@pytest.mark.parametrize("key", sorted(PYTORCH_RECIPES))
def test_trtllm_serve_files(tmp_path, key):
    import json

    recipe = load_recipe(ROOT / PYTORCH_RECIPES[key])
    src = artifact(recipe, tmp_path)
    out = deploy(recipe, src, tmp_path / "out")
    options = out / "trtllm_serve/extra_llm_api_options.yaml"
    launch = json.loads((out / "trtllm_serve/launch.json").read_text())
    model = yaml.safe_load((out / "model_repository/dflash/1/model.yaml").read_text())
    extra = yaml.safe_load(options.read_text())
    # The same LLM arguments as the Triton model, less what trtllm-serve's command line carries.
    assert {k: v for k, v in model.items() if k not in ("model", "backend", "triton_config")} == \
        {k: v for k, v in extra.items()
         if k not in ("enable_iter_perf_stats", "perf_metrics_output_dir", "per_request_spec_decode_stats")}
    single = launch["single_node"]
    assert single[:2] == ["trtllm-serve", str(src.resolve() / "target")]
    assert single[single.index("--config") + 1] == str(options.resolve())  # PR #9104's name, in every 1.3
    world = recipe.parallel.tp * recipe.parallel.pp
    assert launch["mpirun"][launch["mpirun"].index("-n") + 1] == str(world)
    assert launch["mpirun"][-len(single) - 1:] == ["trtllm-llmapi-launch", *single]
    assert launch["srun"][-len(single) - 1:] == ["trtllm-llmapi-launch", *single] and "--mpi=pmix" in launch["srun"]
    assert {"model_repository/dflash/1/model.yaml", "trtllm_serve/launch.json",
            "trtllm_serve/extra_llm_api_options.yaml"} <= set(Manifest.read(out).files)


def test_trtllm_serve_commands_launch_one_model_copy_of_several(tmp_path):
    """parallel.replicas 2 of tp 8 on 16 GPUs: every launch.json command is one copy (8 ranks, one
    node); `serve --launcher srun` runs one such step per copy (tests/launch/test_cluster_launchers.py)."""
    import json

    recipe = load_recipe(ROOT / PYTORCH_RECIPES["gptoss"], ["parallel.replicas=2", "hardware.count=16"])
    out = deploy(recipe, artifact(recipe, tmp_path), tmp_path / "out")
    launch = json.loads((out / "trtllm_serve/launch.json").read_text())
    assert launch["mpirun"][launch["mpirun"].index("-n") + 1] == "8"
    assert launch["srun"][:4] == ["srun", "-N", "1", "--ntasks-per-node=8"]


def test_pytorch_model_is_the_quantize_output_in_a_pipeline_run(tmp_path, tiny_pair):
    """A real run (convert, quantize FP8 through ModelOpt on CPU, deploy) of a pytorch recipe:
    model.yaml and trtllm-serve's options serve the quantize output, not the source."""
    pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt not installed")
    from checkpoints import write_recipe
    from trtllm_dflash.pipeline import run

    path = write_recipe(tmp_path / "r.yaml", *tiny_pair, fmt="fp8", gpu="h100-sxm", backend="pytorch",
                        quantization={"activations": "fp8", "kv_cache": "fp8", "drafter": "bf16"})
    recipe = load_recipe(path)
    stages = run(recipe, tmp_path / "run", until="deploy", progress=False, say=lambda _: None)
    assert [s.stage for s in stages] == ["convert", "quantize", "deploy"]
    quantized = (tmp_path / "run/quantize").resolve()
    assert (quantized / "target/hf_quant_config.json").is_file()
    for f in ("model_repository/dflash/1/model.yaml", "trtllm_serve/extra_llm_api_options.yaml"):
        args = yaml.safe_load((tmp_path / "run/deploy" / f).read_text())
        assert args["speculative_config"]["speculative_model"] == str(quantized / "drafter")
        assert args["kv_cache_config"]["dtype"] == "fp8"
    model = yaml.safe_load((tmp_path / "run/deploy/model_repository/dflash/1/model.yaml").read_text())["model"]
    assert model == str(quantized / "target")
    import json
    assert json.loads((tmp_path / "run/deploy/trtllm_serve/launch.json").read_text())["single_node"][1] == model


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    for name in CASES:
        with tempfile.TemporaryDirectory() as d:
            (GOLDEN / name).write_text(generate(name, Path(d)))
            print("wrote", GOLDEN / name)
