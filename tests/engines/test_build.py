"""build: the plan (trtllm-build commands, plugins, I/O tensors) of every engine recipe is pinned by
golden files; build_config.json holds TensorRT-LLM 1.2.x BuildConfig / PluginConfig fields only
(trtllm_dflash/engines/upstream.py names the upstream files) and every key we require; bad input
is one line, exit 2, nothing written; `run` takes the CPU engine recipe through convert, build
(dry run) and deploy.

To accept an intended change, regenerate the goldens with
`python tests/engines/test_build.py --regenerate` and review the diff.
"""

import json
import sys
from pathlib import Path

import pytest

from trtllm_dflash.artifacts import Manifest, verify_input
from trtllm_dflash.cli import main
from trtllm_dflash.engines.plan import FROM_PLACEHOLDER, make_plan, max_draft_len, models_file, render
from trtllm_dflash.engines.stage import build, cannot_build_here
from trtllm_dflash.engines.upstream import (
    BUILD_CONFIG_FIELDS,
    FROM_DICT_REQUIRED,
    KV_CACHE_TYPES,
    PLUGIN_CONFIG_FIELDS,
    REQUIRED_BUILD_KEYS,
    REQUIRED_PLUGIN_KEYS,
)
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import list_recipes, load_recipe
from trtllm_dflash.recipe.plan.engine_layout import FP8_KV_REUSE_ISSUE, kv_block_reuse, resolve_attention
from trtllm_dflash.recipe.reader import parse_recipe
from trtllm_dflash.recipe.rules import check

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
TINY = ROOT / "recipes/cpu/tiny-pystd-engine.yaml"
OUT = "<OUT>"
ENGINE_RECIPES = sorted(p for p in list_recipes() if p.parent.name in ("hopper", "blackwell", "cpu")
                        and parse_recipe(p).backend.name == "engine")
NAMES = [f"{p.parent.name}-{p.stem}" for p in ENGINE_RECIPES]

pytestmark = pytest.mark.skipif(cannot_build_here() is None, reason="TensorRT-LLM 1.2.x is installed: build is real")


def golden_text(path: Path, out: Path) -> str:
    recipe = load_recipe(path)
    plan = build(recipe, None, out, dry_run=True, say=lambda _: None).plan
    text = render(plan) + "\n"
    return text.replace(str(out.resolve()), OUT).replace(str(models_file()), "<PKG>/engines/trtllm_models.py")


def test_every_hopper_and_blackwell_engine_recipe_is_covered():
    assert {p.parent.name for p in ENGINE_RECIPES} == {"hopper", "blackwell", "cpu"}
    assert len(ENGINE_RECIPES) >= 5 and TINY in ENGINE_RECIPES


@pytest.mark.parametrize("path", ENGINE_RECIPES, ids=NAMES)
def test_dry_run_plan_matches_golden(path, tmp_path):
    """build --dry-run without weights (no --from): commands, plugins and I/O tensors."""
    name = f"{path.parent.name}-{path.stem}.txt"
    assert golden_text(path, tmp_path / "b") == (GOLDEN / name).read_text(), f"differs from tests/engines/golden/{name}"


@pytest.mark.parametrize("path", ENGINE_RECIPES, ids=NAMES)
def test_build_config_holds_only_upstream_fields_and_every_required_key(path, tmp_path):
    recipe = load_recipe(path)
    out = build(recipe, None, tmp_path / "b", dry_run=True, say=lambda _: None).out
    plan = json.loads((out / "plan.json").read_text())
    for role in ("target", "drafter"):
        cfg = json.loads((out / role / "build_config.json").read_text())
        assert set(cfg) <= set(BUILD_CONFIG_FIELDS), set(cfg) - set(BUILD_CONFIG_FIELDS)
        assert set(REQUIRED_BUILD_KEYS) <= set(cfg), set(REQUIRED_BUILD_KEYS) - set(cfg)
        plugins = cfg["plugin_config"]
        assert set(plugins) <= set(PLUGIN_CONFIG_FIELDS), set(plugins) - set(PLUGIN_CONFIG_FIELDS)
        assert set(REQUIRED_PLUGIN_KEYS) <= set(plugins)
        # Values from the recipe, in the JSON types BuildConfig.from_dict takes.
        assert cfg["max_batch_size"] == recipe.build.max_batch_size
        assert cfg["max_num_tokens"] == recipe.build.max_num_tokens
        assert cfg["max_seq_len"] == recipe.build.max_seq_len + max_draft_len(recipe)
        assert cfg["kv_cache_type"] in KV_CACHE_TYPES and cfg["speculative_decoding_mode"] == 1  # NONE
        assert all(isinstance(v, (int, bool, str, type(None), dict)) for v in cfg.values())
        assert plugins["nccl_plugin"] == ("auto" if recipe.world_size > 1 else None)
        assert plugins["use_fp8_context_fmha"] == (role == "target" and recipe.quantization.kv_cache == "fp8"
                                                   and recipe.quantization.target_weights in ("fp8", "nvfp4"))
        # The TensorRT timing cache goes into the engine's own directory: paths are relative to the
        # build directory, where the commands run.
        assert cfg["output_timing_cache"] == f"{role}/timing.cache" and cfg["input_timing_cache"] is None
        engine = next(e for e in plan["engines"] if e["role"] == role)
        assert engine["build_config"] == cfg
        assert engine["command"][engine["command"].index("--build_config") + 1] == f"{role}/build_config.json"
        assert (out / engine["command"][engine["command"].index("--model_cls_file") + 1]).is_file()
    target = json.loads((out / "target" / "build_config.json").read_text())
    drafter = json.loads((out / "drafter" / "build_config.json").read_text())
    # The target verifies drafts as prompt tokens: no speculative decoding inputs, whole-sequence requests.
    assert target["max_draft_len"] == 0 and target["max_input_len"] == target["max_seq_len"] - 1
    assert target["kv_cache_type"] == "PAGED"
    assert plan["kv_block_reuse"] is kv_block_reuse(recipe) and plan["kv_block_reuse"] <= target["plugin_config"][
        "use_paged_context_fmha"]  # reuse only where the engine has paged context FMHA
    # The drafter's block is max_draft_len + 1; its attention is our plugin, not gpt_attention.
    assert drafter["max_draft_len"] == max_draft_len(recipe) <= recipe.drafter_facts.block_size - 1
    assert drafter["plugin_config"]["gpt_attention_plugin"] is None
    assert "trtllm_dflash::kv_inject_attention" in [p["name"] for p in plan["engines"][1]["plugins"]]
    m = verify_input(out, ("build",), recipe)
    assert m.extra["dry_run"] is True and m.input is None


@pytest.mark.parametrize("tp,placement", [(4, "rank0"), (8, "split")])
def test_tp_plan_builds_the_drafter_where_the_placement_rule_puts_it(tmp_path, tp, placement):
    """Qwen3-8B FP8 (BF16 KV cache) on H100s: at tp 4 the whole drafter (9.3 GiB with its context
    cache) is no larger than a rank's share of the target (11.2 GiB): one drafter engine, no NCCL;
    at tp 8 the share (5.6 GiB) is smaller: one drafter engine per rank, NCCL plugin, all-reduce
    workspace."""
    recipe = load_recipe(ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml", [f"parallel.tp={tp}", f"hardware.count={tp}"])
    plan = make_plan(recipe, tmp_path / "quantize", tmp_path / "b")
    assert plan.world_size == tp and plan.drafter_parallelism["placement"] == placement
    n = {"target": tp, "drafter": tp if placement == "split" else 1}
    for e in plan.engines:
        assert e.command[-2:] == ["--workers", str(n[e.role])]
        assert e.checkpoint_dir == f"../quantize/{e.role}"  # relative to the build directory
        if n[e.role] > 1:
            assert e.mpi_command[:3] == ["mpirun", "-n", str(n[e.role])] and e.mpi_command[-2:] == ["--workers", "1"]
        else:
            assert e.mpi_command is None
        assert ("nccl_plugin" in [p["name"] for p in e.plugins]) == (n[e.role] > 1)
        assert ("all_reduce_workspace" in [t.name for t in e.inputs]) == (n[e.role] > 1)
    assert plan.engine("drafter").dims["kv_heads"] == recipe.drafter_facts.num_kv_heads // n["drafter"]
    assert ("drafter shard" in plan.launch["serve"]) == (placement == "split") and "LEADER" in plan.launch["serve"]


@pytest.mark.parametrize("path", ENGINE_RECIPES, ids=NAMES)
def test_every_build_config_has_what_build_config_from_dict_reads_without_a_default(path, tmp_path):
    """The shipped plans before this check omitted opt_num_tokens, which the stored 1.2-era
    BuildConfig.from_dict pops with no default: KeyError inside trtllm-build (the stand-in
    reads as that copy does, independently of upstream.FROM_DICT_REQUIRED)."""
    import fake_trtllm  # tests/helpers (imported here: `python tests/engines/test_build.py --regenerate` lacks it)

    recipe = load_recipe(path)
    plan = make_plan(recipe, None, tmp_path / "b")
    for e in plan.engines:
        cfg = e.build_config
        assert set(FROM_DICT_REQUIRED) <= set(cfg), set(FROM_DICT_REQUIRED) - set(cfg)
        got = fake_trtllm.BuildConfig.from_dict(cfg)
        # check_max_num_tokens'
        assert got.opt_num_tokens == min(recipe.build.max_batch_size, recipe.build.max_num_tokens)
        assert got.kv_cache_type == cfg["kv_cache_type"] and got.output_timing_cache == cfg["output_timing_cache"]
        without = {k: v for k, v in cfg.items() if k != "opt_num_tokens"}  # what the shipped plans wrote
        with pytest.raises(KeyError, match="opt_num_tokens"):
            fake_trtllm.BuildConfig.from_dict(without)


# (recipe, overrides, (context FMHA, paged context FMHA, FP8 context FMHA) after build(), KV block reuse
# left to the layout: off over an FP8 KV cache, engine_layout.FP8_KV_REUSE_ISSUE).
H100 = ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml"
BF16_WEIGHTS = ["quantization.target_weights=bf16", "quantization.activations=bf16", "build.max_num_tokens=8192"]
FP8_KV = ["quantization.kv_cache=fp8"]
LAYOUTS = {
    "fp8 weights, fp8 kv": (H100, FP8_KV, (True, True, True), False),
    "fp8 weights, bf16 kv": (H100, [], (True, True, False), True),
    "bf16 weights, bf16 kv": (H100, BF16_WEIGHTS, (True, True, False), True),
    "bf16 weights, fp8 kv": (H100, [*BF16_WEIGHTS, *FP8_KV], (True, False, False), False),
    "nvfp4 weights, fp8 kv": (ROOT / "recipes/blackwell/b300-qwen3-8b-nvfp4.yaml", FP8_KV, (True, True, True), False),
    "fp32 weights": (TINY, [], (False, False, False), False),
}


def flags(f) -> tuple[bool, bool, bool]:
    return f.context_fmha, f.paged_context_fmha, f.fp8_context_fmha


@pytest.mark.parametrize("name", LAYOUTS)
def test_target_attention_flags_are_what_build_resolves_and_reuse_follows(name, tmp_path):
    """build() turns paged context FMHA off for bf16 weights over an FP8 KV cache (its FP8 context
    FMHA needs an FP8 / NVFP4 checkpoint), and attentionOp.cpp has no fused context attention for
    fp32: the plan writes what the engine gets and claims KV block reuse only where it can be had."""
    path, overrides, want, reuse = LAYOUTS[name]
    recipe = load_recipe(path, overrides)
    plan = make_plan(recipe, None, tmp_path / "b")
    pc = plan.engine("target").build_config["plugin_config"]
    assert (pc["context_fmha"], pc["use_paged_context_fmha"], pc["use_fp8_context_fmha"]) == want
    assert plan.kv_block_reuse is reuse
    assert ("paged context FMHA (KV block reuse)" in plan.engine("target").plugins[0]["use"]) is want[1]
    note = next(n for n in plan.notes if n.startswith("verify:"))
    assert note.startswith("verify: KV block reuse on" if reuse else "verify: KV block reuse off")
    assert ("every round recomputes its whole sequence" in note) is not reuse
    if not want[1]:
        assert plan.engine("target").attention["why"] and plan.engine("target").attention["why"][0] in note
    if want[1] and not reuse:
        assert FP8_KV_REUSE_ISSUE in note


def test_resolve_attention_follows_builds_branches():
    # Pre-Ada: no FP8 context FMHA, so no paged context FMHA over an FP8 KV cache either.
    assert flags(resolve_attention("bfloat16", "FP8", True, 80, fp8=True)) == (True, False, False)
    assert flags(resolve_attention("bfloat16", "FP8", False, 80)) == (True, True, False)
    # Paged context FMHA: FP8 context FMHA follows the KV cache both ways.
    assert flags(resolve_attention("float16", "NVFP4", False, 100, fp8=True)) == (True, True, False)
    assert flags(resolve_attention("float16", "NVFP4", True, 100, fp8=False)) == (True, True, True)
    # Without paged context FMHA build() leaves an asked-for FP8 context FMHA alone.
    assert flags(resolve_attention("bfloat16", "FP8", False, 90, paged=False, fp8=True)) == (True, False, True)


def test_check_refuses_kv_reuse_the_layout_cannot_honour(tmp_path):
    h100 = H100
    fp8kv = ["--set", FP8_KV[0]]
    bf16_fp8kv = [a for o in BF16_WEIGHTS for a in ("--set", o)] + fp8kv
    rc, _, err = cli("check", h100, *bf16_fp8kv, "--set", "build.kv_cache_reuse=true")
    line = one_line_error(rc, err)
    assert "build.kv_cache_reuse: true" in line and "without paged context FMHA" in line
    assert "quantization.target_weights bf16" in line and "quantization.kv_cache fp8" in line
    rc, _, err = cli("check", TINY, "--set", "build.kv_cache_reuse=true")
    assert "build.kv_cache_reuse: true" in one_line_error(rc, err) and "float32" in err
    # Left to the layout it is a warning that prices the recompute; asked off it is off everywhere.
    rc, _, err = cli("check", h100, *bf16_fp8kv)
    assert rc == 0 and "note: build.kv_cache_reuse: verify: KV block reuse off (" in err
    assert "every round recomputes its whole sequence" in err
    # Over an FP8 KV cache reuse is opt-in (wrong outputs upstream, the issue is named either way).
    rc, _, err = cli("check", h100, *fp8kv)
    assert rc == 0 and ("note: build.kv_cache_reuse: verify: KV block reuse off (an FP8 KV cache: reused blocks gave "
                        f"wrong outputs upstream ({FP8_KV_REUSE_ISSUE}, open)") in err
    rc, _, err = cli("check", h100, *fp8kv, "--set", "build.kv_cache_reuse=true")
    assert rc == 0
    assert "note: build.kv_cache_reuse: on: paged context FMHA; asked for over an FP8 KV cache despite" in err
    assert make_plan(load_recipe(h100, [*FP8_KV, "build.kv_cache_reuse=true"]), None, tmp_path / "on").kv_block_reuse
    off = make_plan(load_recipe(h100, ["build.kv_cache_reuse=false"]), None, tmp_path / "b")
    assert off.kv_block_reuse is False and off.engine("target").build_config["plugin_config"]["use_paged_context_fmha"]
    rc, _, err = cli("check", h100, "--set", "build.kv_cache_reuse=false")
    assert rc == 0 and "note: build.kv_cache_reuse: verify: KV block reuse off (build.kv_cache_reuse false)" in err
    rc, _, err = cli("check", ROOT / "recipes/cpu/tiny-pystd.yaml", "--set", "build.kv_cache_reuse=false")
    assert "applies to the engine backend only" in one_line_error(rc, err)


def test_check_refuses_max_num_tokens_below_a_whole_verify_sequence():
    """With context FMHA the 1.2.1 Executor caps a prompt at min(max_seq_len - 1, max_num_tokens)
    (trtGptModel.h); a verify round's prompt is the whole sequence, up to max_seq_len + drafts."""
    h100 = H100
    rc, _, err = cli("check", h100, "--set", "build.max_num_tokens=4096")
    line = one_line_error(rc, err)
    assert "build.max_num_tokens: 4096 < 4110 = build.max_seq_len + max_draft_len 15 - 1" in line
    assert cli("check", h100, "--set", "build.max_num_tokens=4110")[0] == 0
    # Without context FMHA (fp32) the cap is the engine's max_input_len, which the plan sets to max_seq_len - 1.
    assert cli("check", TINY, "--set", "build.max_num_tokens=300")[0] == 0


def test_the_gpu_checklist_builds_bf16_engines_with_kv_reuse(tmp_path):
    from checklist import checklist_recipe

    plan = make_plan(checklist_recipe(), None, tmp_path / "b")
    for e in plan.engines:
        assert e.build_config["plugin_config"]["dtype"] == "bfloat16" and e.kv_cache_dtype == "bfloat16"
    pc = plan.engine("target").build_config["plugin_config"]
    assert pc["context_fmha"] and pc["use_paged_context_fmha"] and plan.kv_block_reuse


def fake_trtllm_build(ran: list, plugin_changes: dict | None = None):
    """A stand-in of trtllm-build run as the stage runs it: reads --build_config relative to its
    working directory, writes the timing cache, rank0.engine and the engine's config.json
    (build_config as it built it: the file's, with `plugin_changes[role]` applied to its plugin_config)."""
    import subprocess

    def trtllm_build(cmd, cwd=None):
        here = Path(cwd or ".")
        args = dict(zip(cmd[1::2], cmd[2::2]))
        cfg = json.loads((here / args["--build_config"]).read_text())
        ran.append(cfg)
        assert (here / args["--model_cls_file"]).is_file()
        assert (here / args["--checkpoint_dir"] / "config.json").is_file()
        (here / (cfg.get("output_timing_cache") or "model.cache")).write_bytes(b"cache")
        (here / args["--output_dir"]).mkdir(parents=True)
        (here / args["--output_dir"] / "rank0.engine").write_bytes(b"engine")
        changes = (plugin_changes or {}).get(args["--output_dir"].split("/")[0], {})
        built = {**cfg, "plugin_config": {**cfg["plugin_config"], **changes}}
        (here / args["--output_dir"] / "config.json").write_text(json.dumps({"build_config": built}))
        return subprocess.CompletedProcess(cmd, 0)

    return trtllm_build


def test_build_fails_naming_a_plugin_setting_trtllm_build_did_not_keep(tmp_path, converted, monkeypatch):
    """commands/build.py hands BuildConfig.from_json_file the CLI's PluginConfig too: if the engine's
    config.json disagrees with the planned build_config.json, build fails in one line naming the
    key and both values, and writes nothing."""
    from trtllm_dflash.engines import stage

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stage, "cannot_build_here", lambda: None)
    monkeypatch.setattr(stage.subprocess, "run", fake_trtllm_build([], {"target": {"remove_input_padding": False}}))
    with pytest.raises(UserError, match=r"target/engines/config.json: build_config.plugin_config.remove_input_padding "
                                        r"is False, the plan's target/build_config.json has True"):
        build(load_recipe(TINY), converted, tmp_path / "b", say=lambda _: None)
    assert not (tmp_path / "b").exists()
    # The drafter plans no attention plugin; the CLI's default would add one.
    monkeypatch.setattr(stage.subprocess, "run", fake_trtllm_build([], {"drafter": {"gpt_attention_plugin": "auto"}}))
    with pytest.raises(UserError,
                       match=r"b/drafter/engines/config.json: build_config.plugin_config.gpt_attention_plugin "
                                        r"is 'auto', the plan's drafter/build_config.json has None"):
        build(load_recipe(TINY), converted, tmp_path / "b", say=lambda _: None)
    # "auto" stands for the plugin dtype, saved either way; the command line's None is a mismatch.
    monkeypatch.setattr(stage.subprocess, "run", fake_trtllm_build([], {"target": {"gemm_plugin": None}}))
    with pytest.raises(UserError, match=r"build_config.plugin_config.gemm_plugin is None, the plan's target"):
        build(load_recipe(TINY), converted, tmp_path / "b", say=lambda _: None)
    monkeypatch.setattr(stage.subprocess, "run", fake_trtllm_build([], {"target": {"gpt_attention_plugin": "float32"}}))
    assert build(load_recipe(TINY), converted, tmp_path / "b", say=lambda _: None).built


def test_the_timing_cache_is_written_inside_the_stage_output(tmp_path, converted, monkeypatch):
    """trtllm-build writes build_config's output_timing_cache (upstream default 'model.cache': the
    working directory). A stand-in of it does the same, from the --build_config file it is given,
    opening every path as trtllm-build does: relative to its working directory."""

    from trtllm_dflash.engines import stage

    ran = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stage, "cannot_build_here", lambda: None)
    monkeypatch.setattr(stage.subprocess, "run", fake_trtllm_build(ran))
    out = tmp_path / "b"
    result = build(load_recipe(TINY), converted, out, say=lambda _: None)
    assert result.built and len(ran) == 2 and not (tmp_path / "model.cache").exists()
    for role in ("target", "drafter"):
        assert (out / role / "timing.cache").read_bytes() == b"cache"
        written = json.loads((out / role / "build_config.json").read_text())
        assert written["output_timing_cache"] == f"{role}/timing.cache"
    assert "timing.cache" in json.dumps(Manifest.read(out).files)


# ----------------------------------------------------------------------------- bad input


def cli(*args) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc: int, err: str) -> str:
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny engine recipe's convert output (2 s)."""
    from trtllm_dflash.convert.convert import convert

    out = tmp_path_factory.mktemp("conv") / "convert"
    return convert(load_recipe(TINY), out, progress=False)


def test_build_on_a_non_engine_recipe_is_refused(tmp_path):
    rc, _, err = cli("build", ROOT / "recipes/cpu/tiny-pystd.yaml", "--out", tmp_path / "b", "--dry-run")
    assert "backend.name is 'reference'" in one_line_error(rc, err) and "engine backend only" in err
    assert not (tmp_path / "b").exists()


def test_from_that_is_not_this_recipes_checkpoint_is_refused(tmp_path, converted):
    junk = tmp_path / "junk"
    junk.mkdir()
    rc, _, err = cli("build", TINY, "--from", junk, "--out", tmp_path / "b")
    assert f"{junk}: no manifest.json" in one_line_error(rc, err)
    # Another recipe's convert output (tp differs): the manifest field is named.
    rc, _, err = cli("build", TINY, "--set", "parallel.tp=2", "--from", converted, "--out", tmp_path / "b")
    assert "manifest field recipe_fields.parallel.tp is 1" in one_line_error(rc, err)
    # A later stage's output instead of a checkpoint.
    b = build(load_recipe(TINY), None, tmp_path / "plan", dry_run=True, say=lambda _: None).out
    rc, _, err = cli("build", TINY, "--from", b, "--out", tmp_path / "b")
    assert "manifest field stage is 'build'; expected a convert output" in one_line_error(rc, err)
    assert not (tmp_path / "b").exists()


def test_moe_and_other_architectures_are_refused(tmp_path):
    moe = ROOT / "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"
    rc, _, err = cli("build", moe, "--set", "backend.name=engine", "--set", "backend.trtllm_version=1.2.1",
                     "--out", tmp_path / "b", "--dry-run")
    assert "engine does not support qwen3_moe targets" in one_line_error(rc, err)
    # The build's own check (a recipe loaded without rules), naming the field.
    recipe = parse_recipe(moe, ["backend.name=engine"])
    with pytest.raises(UserError, match=r"target.arch: MoE \(128 experts\) targets are not on the engine path"):
        build(recipe, None, tmp_path / "b", dry_run=True)
    gpt_oss = parse_recipe(ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml", ["backend.name=engine"])
    with pytest.raises(UserError, match="target.arch: .*not on the engine path.*dense llama, qwen3"):
        build(gpt_oss, None, tmp_path / "b", dry_run=True)
    assert not (tmp_path / "b").exists()


def test_max_draft_len_above_the_drafters_training_is_refused(tmp_path):
    llama = ROOT / "recipes/hopper/h100-llama-3.1-8b-fp8.yaml"  # drafter trained at block 10
    rc, _, err = cli("build", llama, "--set", "speculative.block_size=16", "--set", "speculative.draft_len=[]",
                     "--out", tmp_path / "b", "--dry-run")
    assert "speculative.block_size: 16 > 10" in one_line_error(rc, err)
    recipe = parse_recipe(llama, ["speculative.draft_len=[{max_concurrency: 64, draft_len: 12}]"])
    with pytest.raises(UserError, match=r"speculative.draft_len.0.draft_len: max_draft_len 12 needs a block of 13, "
                                        r"but the drafter was trained with block_size 10"):
        build(recipe, None, tmp_path / "b", dry_run=True)
    assert not (tmp_path / "b").exists()


def test_without_tensorrt_llm_the_plan_is_written_then_one_line_names_the_container(tmp_path, converted):
    out = tmp_path / "b"
    rc, stdout, err = cli("build", TINY, "--from", converted, "--out", out)
    line = one_line_error(rc, err)
    assert "TensorRT-LLM is not installed here" in line and "Triton 26.07-trtllm-python-py3" in line
    assert "TensorRT-LLM 1.2.1" in line and f"--from {converted}" in line
    assert "trtllm-build --checkpoint_dir" in stdout  # the plan is printed too
    m = verify_input(out, ("build",), load_recipe(TINY))
    assert m.extra["dry_run"] is True and m.input["stage"] == "convert"
    plan = json.loads((out / "plan.json").read_text())
    assert (out / plan["engines"][0]["checkpoint_dir"]).resolve() == converted.resolve() / "target"
    assert not list(out.rglob("*.engine"))
    # A dry-run output is replaced by the next build without --overwrite; --from without weights is required.
    assert cli("build", TINY, "--from", converted, "--out", out, "--dry-run")[0] == 0
    rc, _, err = cli("build", TINY, "--out", tmp_path / "c")
    assert "--from is required to build engines" in one_line_error(rc, err)
    assert not (tmp_path / "c").exists()


def test_dry_run_cli_prints_the_commands_without_weights(tmp_path):
    rc, stdout, _ = cli("build", ROOT / "recipes/hopper/h100-qwen3-8b-fp8.yaml", "--out", tmp_path / "b", "--dry-run")
    assert rc == 0
    assert f"commands run in {tmp_path / 'b'} (their paths are relative to it)" in stdout
    assert f"trtllm-build --checkpoint_dir {FROM_PLACEHOLDER}/target --build_config target/build_config.json " \
           "--model_cls_file trtllm_models.py" in stdout
    assert "--model_cls_name DFlashQwen3Target" in stdout and "--model_cls_name DFlashDrafter" in stdout
    assert stdout.strip().endswith("(plan only (dry run): plan.json, target/ and drafter/build_config.json)")


def test_engine_on_cpu_is_a_warning_and_pytorch_on_cpu_stays_an_error():
    issues = check(load_recipe(TINY))
    assert [(i.level, i.message) for i in issues if i.field == "backend"] == [
        ("warning",
         "engine on cpu: build --dry-run only; served by the emulated engine runners (or --runners reference)")]
    torch_cpu = parse_recipe(TINY, ["backend={name: pytorch, trtllm_version: 1.3.0}"])
    assert any(i.level == "error" and "pytorch needs NVIDIA GPUs" in i.message for i in check(torch_cpu))


# ----------------------------------------------------------------------------- the pipeline


def test_run_takes_the_cpu_engine_recipe_through_convert_build_and_deploy(tmp_path):
    from trtllm_dflash.pipeline import run

    said: list[str] = []
    recipe = load_recipe(TINY)
    stages = run(recipe, tmp_path, until="deploy", progress=False, say=said.append)
    assert [(s.stage, s.status) for s in stages] == [("convert", "ran"), ("build", "ran"), ("deploy", "ran")]
    assert any(line.startswith("build: TensorRT-LLM is not installed here: writing the dry-run plan") for line in said)
    built = verify_input(tmp_path / "build", ("build",), recipe)
    assert built.extra["dry_run"] is True and built.input["path"] == "../convert"
    assert built.input_dir(tmp_path / "build") == (tmp_path / "convert").resolve()
    deployed = Manifest.read(tmp_path / "deploy")
    assert deployed.input["stage"] == "build" and deployed.extra["artifact"] == "../build"  # relative to deploy/
    config = (tmp_path / "deploy/model_repository/dflash/config.pbtxt").read_text()
    assert 'string_value: "../build"' in config and str(tmp_path) not in config
    # Make-like: everything is current the second time.
    again = run(recipe, tmp_path, until="deploy", progress=False, say=said.append)
    assert [s.status for s in again] == ["skipped"] * 3


def regenerate() -> None:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    for path, name in zip(ENGINE_RECIPES, NAMES):
        with tempfile.TemporaryDirectory() as d:
            (GOLDEN / f"{name}.txt").write_text(golden_text(path, Path(d) / "b"))
        print(f"wrote tests/engines/golden/{name}.txt")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        regenerate()
    else:
        sys.exit("usage: python tests/engines/test_build.py --regenerate")
