"""convert: bad inputs fail before anything is written; interrupted runs never look complete; resume."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import make_drafter, make_target, write_recipe
from trtllm_dflash.artifacts import Manifest, check_files, sha256_file
from trtllm_dflash.cli import main
from trtllm_dflash.convert import convert as convert_module
from trtllm_dflash.convert.convert import convert
from trtllm_dflash.convert.sources import load_sources
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe


def _nothing_written(parent: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{out.name}")]


def _cli(*args) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(list(map(str, args)))
    return rc, err.getvalue()


def _rewrite(directory: Path, edit) -> None:
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path, tiny_pair):
    target = make_target(tmp_path / "t")
    _rewrite(target, lambda t: t.pop("model.layers.2.self_attn.k_proj.weight"))
    recipe = write_recipe(tmp_path / "r.yaml", target, tiny_pair[1], tp=2)
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2
    assert "missing tensor model.layers.2.self_attn.k_proj.weight (expected shape [32, 64])" in err
    _nothing_written(tmp_path, tmp_path / "out")


def test_mis_shaped_tensor_is_named(tmp_path, tiny_pair):
    drafter = make_drafter(tmp_path / "d")
    _rewrite(drafter, lambda t: t.__setitem__("layers.1.mlp.up_proj.weight", torch.zeros(96, 64)))
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], drafter, tp=2)
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2
    assert "layers.1.mlp.up_proj.weight has shape [96, 64], expected [128, 64]" in err
    _nothing_written(tmp_path, tmp_path / "out")


def test_tp_not_dividing_heads_is_a_recipe_error(tmp_path, tiny_pair):
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=3)
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2 and "parallel.tp: 3 does not divide target num_attention_heads 4" in err
    _nothing_written(tmp_path, tmp_path / "out")


def test_tp_not_dividing_the_ffn_width_is_named(tmp_path, tiny_pair):
    target = make_target(tmp_path / "t", intermediate_size=90)
    recipe = write_recipe(tmp_path / "r.yaml", target, tiny_pair[1], tp=4)
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2 and "parallel.tp: 4 does not divide target intermediate_size 90; allowed: [1, 2]" in err
    _nothing_written(tmp_path, tmp_path / "out")


def test_unknown_architecture_is_named(tmp_path, tiny_pair):
    target = make_target(tmp_path / "t")
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    recipe = write_recipe(tmp_path / "r.yaml", target, tiny_pair[1])
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2 and "model_type 'mistral' is not supported" in err
    # a family the recipe knows (gpt_oss) but no weight map converts to the trtllm layout; the
    # pytorch backend's hf layout passes it through (no weight map), and names what it serves
    (target / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_oss"}))
    r = load_recipe(write_recipe(tmp_path / "r2.yaml", target, tiny_pair[1], gpu="b200", fmt="bf16", backend="pytorch"))
    with pytest.raises(UserError,
                       match="model_type 'gpt_oss' has no weight map for the trtllm layout; supported: qwen3, llama, "
                             "qwen3_moe"):
        load_sources(r, "trtllm")
    assert load_sources(r).target_cfg.arch == "gpt_oss"
    (target / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral"}))
    with pytest.raises(UserError,
                       match="model_type 'mistral' is not served from the hf layout; supported: qwen3, llama, "
                             "qwen3_moe, gpt_oss"):
        load_sources(r, "hf")
    _nothing_written(tmp_path, tmp_path / "out")


def test_a_passed_through_target_whose_embedding_is_not_its_configs_is_named(tmp_path):
    target, drafter = make_target(tmp_path / "t", "gpt_oss"), make_drafter(tmp_path / "d")
    for d in (target, drafter):  # both configs claim a vocabulary the weights do not have
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "vocab_size": 512}))
    recipe = write_recipe(tmp_path / "r.yaml", target, drafter, fmt="bf16", gpu="b200", backend="pytorch")
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2 and "tensor model.embed_tokens.weight has shape [256, 64], expected [512, 64]" in err
    _nothing_written(tmp_path, tmp_path / "out")


def test_a_native_format_must_be_the_checkpoints_own(tmp_path, tiny_pair):
    """quantization.target_weights mxfp4 serves gpt-oss's MXFP4 as shipped: an unquantized
    checkpoint is refused, and so is a float recipe on an MXFP4 checkpoint (it would be served as
    MXFP4); an FP8 KV cache would re-export the target, so `check` refuses mxfp4 with it."""
    import shutil

    from checkpoints import mxfp4_experts

    bf16 = make_target(tmp_path / "t", "gpt_oss")
    mx = mxfp4_experts(shutil.copytree(bf16, tmp_path / "mx"))
    q = {"target_weights": "mxfp4", "activations": "bf16", "kv_cache": "bf16", "drafter": "bf16"}
    recipe = write_recipe(tmp_path / "r.yaml", bf16, tiny_pair[1], gpu="b200", backend="pytorch", quantization=q)
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2 and "quantization.target_weights: mxfp4 serves the checkpoint's own mxfp4 weights" in err
    recipe = write_recipe(tmp_path / "r.yaml", mx, tiny_pair[1], fmt="bf16", gpu="b200", backend="pytorch")
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress")
    assert rc == 2
    assert "the checkpoint ships mxfp4 weights (quantization_config), so quantization.target_weights bf16" in err
    _nothing_written(tmp_path, tmp_path / "out")
    recipe = write_recipe(tmp_path / "r.yaml", mx, tiny_pair[1], gpu="b200", backend="pytorch",
                          quantization={**q, "kv_cache": "fp8"})
    rc, err = _cli("check", recipe)
    assert rc == 2
    assert "mxfp4 serves the checkpoint's own weights as shipped, but kv_cache fp8 needs the quantize stage" in err


def test_nvfp4_on_hopper_is_refused_before_writing(tmp_path, tiny_pair):
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=2, fmt="bf16", gpu="h100-sxm", backend="engine")
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--no-progress",
                   "--set", "quantization.target_weights=nvfp4", "--set", "quantization.activations=nvfp4")
    assert rc == 2
    assert ("quantization.target_weights: nvfp4 is not supported on h100-sxm (NVFP4 needs Blackwell: b200 or "
            "b300)") in err
    _nothing_written(tmp_path, tmp_path / "out")


def test_out_dir_holding_a_different_checkpoint_is_refused(tmp_path, tiny_pair):
    out = tmp_path / "out"
    convert(load_recipe(write_recipe(tmp_path / "a.yaml", *tiny_pair, tp=1)), out, progress=False)
    before = (out / "manifest.json").read_text()
    rc, err = _cli("convert", write_recipe(tmp_path / "b.yaml", *tiny_pair, tp=2), "--out", out, "--no-progress")
    assert rc == 2 and ("already holds a convert output of recipe 'tiny-test' made from other recipe fields "
                        "(parallel.tp)") in err
    assert (out / "manifest.json").read_text() == before
    check_files(out, Manifest.read(out))
    # a non-stage directory is refused too
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("mine")
    rc, err = _cli("convert", tmp_path / "a.yaml", "--out", tmp_path / "other", "--no-progress")
    assert rc == 2 and "exists and is not a trtllm-dflash output" in err


def test_interrupted_conversion_leaves_nothing_complete_and_resumes(tmp_path, tiny_pair, monkeypatch):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=2))
    out = tmp_path / "out"
    real = convert_module._write_rank
    written = []

    def flaky(path, role, *args, **kw):
        if role == "drafter":
            raise KeyboardInterrupt  # killed while writing the drafter shards
        written.append(path.name)
        return real(path, role, *args, **kw)

    monkeypatch.setattr(convert_module, "_write_rank", flaky)
    with pytest.raises(KeyboardInterrupt):
        convert(recipe, out, progress=False)
    assert not out.exists()
    with pytest.raises(UserError, match="no manifest.json"):
        check_files(tmp_path / ".out.resume", Manifest.read(tmp_path / ".out.resume"))
    assert written == ["rank0.safetensors.partial", "rank1.safetensors.partial"]

    written.clear()
    monkeypatch.setattr(convert_module, "_write_rank",
                        lambda path, role, *a, **k: (written.append((role, path.name)), real(path, role, *a, **k)))
    convert(recipe, out, progress=False, resume=True)
    assert [r for r, _ in written] == ["drafter", "drafter"]  # target shards were kept
    check_files(out, Manifest.read(out))
    assert not (tmp_path / ".out.resume").exists()
    fresh = convert(recipe, tmp_path / "fresh", progress=False)
    for rel in ("target/rank0.safetensors", "target/rank1.safetensors", "drafter/rank1.safetensors"):
        assert sha256_file(out / rel) == sha256_file(fresh / rel)


def test_resume_refuses_data_of_other_inputs(tmp_path, tiny_pair, monkeypatch):
    r1 = load_recipe(write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=2))
    monkeypatch.setattr(convert_module, "_write_rank", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        convert(r1, tmp_path / "out", progress=False)
    monkeypatch.undo()
    r2 = load_recipe(write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=1))
    with pytest.raises(UserError, match="resume data was written for other inputs or settings"):
        convert(r2, tmp_path / "out", progress=False, resume=True)


def test_sigkill_mid_conversion(tmp_path, tiny_pair):
    """A real kill -9 (no cleanup runs): the leftovers never pass as a complete output."""
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair, tp=2)
    script = textwrap.dedent(f"""
        import os, signal
        from trtllm_dflash.convert import convert as c
        from trtllm_dflash.recipe import load_recipe
        real = c._write_rank
        def killer(path, role, *a, **k):
            real(path, role, *a, **k)
            if role == "drafter":
                os.kill(os.getpid(), signal.SIGKILL)
        c._write_rank = killer
        c.convert(load_recipe({str(recipe)!r}), {str(tmp_path / 'out')!r}, progress=False)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9
    assert not (tmp_path / "out").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert leftovers  # the temp dir and the resume dir
    for p in leftovers:
        with pytest.raises(UserError):
            check_files(p, Manifest.read(p))
    rc, err = _cli("convert", recipe, "--out", tmp_path / "out", "--resume", "--no-progress")
    assert rc == 0, err
    check_files(tmp_path / "out", Manifest.read(tmp_path / "out"))
    assert os.path.exists(tmp_path / "out" / "drafter" / "rank1.safetensors")
