"""NVIDIA Dynamo's facts (recipe/dynamo.py, recipe/catalog/dynamo-1.6.1.yaml and
dgd-v1beta1.schema.json): they agree with the image table and the pytorch backend's pin, every
source line reads as recorded in the installed ai-dynamo wheel (where it is installed: the `dynamo`
extra), the command check refuses what the release lacks, and the router follows prefix reuse."""

import importlib.metadata
import re
from pathlib import Path

import pytest

from trtllm_dflash.recipe import dynamo, images, load_recipe
from trtllm_dflash.recipe.trtllm_api import PINNED

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS = ROOT / "recipes/blackwell/b300x8-gpt-oss-120b-nvfp4.yaml"
QWEN = ROOT / "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"


def sources(node, where=""):
    """Every recorded source (a dict with path and line_no) in the facts, with where it sits."""
    if isinstance(node, dict):
        if "path" in node and "line_no" in node:
            yield where, node
        for key, value in node.items():
            yield from sources(value, f"{where}.{key}")


def test_the_facts_agree_with_the_image_table_and_the_pinned_trtllm():
    (row,) = [im for im in images.images() if im.family == "dynamo-trtllm-runtime"]
    assert row.dynamo == dynamo.version() and row.tag == dynamo.version()
    assert row.trtllm == dynamo.trtllm_version() == PINNED
    assert dynamo.facts()["wheel"]["package"] == f"ai-dynamo=={dynamo.version()}"
    assert re.fullmatch(r"[0-9a-f]{64}", dynamo.facts()["wheel"]["sha256"])


def test_every_fact_names_its_line():
    found = list(sources(dynamo.facts()))
    assert len(found) > 30
    for where, s in found:
        assert s["path"] and s["line_no"] > 0 and (s.get("line") or s.get("names")), where
    for name, spec in {**dynamo.flags("worker"), **dynamo.flags("frontend")}.items():
        assert f'"{name}"' in spec["source"]["line"], name


@pytest.fixture(scope="module")
def wheel():
    """The installed ai-dynamo distribution of the pinned version (skip without it)."""
    try:
        dist = importlib.metadata.distribution("ai-dynamo")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("ai-dynamo is not installed (pip install 'trtllm_dflash[dynamo]')")
    if dist.version != dynamo.version():
        pytest.skip(f"ai-dynamo {dist.version} is installed; the facts are {dynamo.version()}'s")
    return dist


def test_every_source_line_reads_so_in_the_installed_wheel(wheel):
    for where, s in sources(dynamo.facts()):
        lines = Path(wheel.locate_file(s["path"])).read_text().splitlines()
        line = lines[s["line_no"] - 1].strip()
        assert line == s["line"] if "line" in s else s["names"] in line, f"{where}: {s['path']}:{s['line_no']}"


def test_the_flags_and_choices_read_so_in_the_wheels_parsers(wheel):
    """Each flag's add_argument call, from its flag_name line on: the env var, the default and the
    choices are the ones recorded (a changed default or a dropped choice fails here)."""
    for process in ("worker", "frontend"):
        for name, spec in dynamo.flags(process).items():
            src = spec["source"]
            text = Path(wheel.locate_file(src["path"])).read_text().splitlines()
            call = "\n".join(text[src["line_no"] - 1:src["line_no"] + 25]).split("add_", 1)[0]
            if spec.get("env"):
                assert f'env_var="{spec["env"]}"' in call, name
            for choice in spec.get("choices") or []:
                assert f'"{choice}"' in call or "DisaggregationMode" in call, (name, choice)


def test_the_check_refuses_what_the_release_lacks():
    assert dynamo.command("worker", ["--model-path", "m", "--no-publish-kv-events"])[:3] == \
        ["python3", "-m", "dynamo.trtllm"]
    for argv, message in [(["--kv-events"], "not a flag"), (["--router-mode", "kv"], "not a flag"),
                          (["--disaggregation-mode", "prefill_and_decode"], "not one of"),
                          (["--tensor-parallel-size"], "takes a value")]:
        with pytest.raises(AssertionError, match=message):
            dynamo.checked("worker", argv)
    assert dynamo.checked("frontend", ["--router-mode", "kv"])


@pytest.mark.parametrize("path, overrides, mode", [
    (QWEN, [], "round-robin"),  # 1.3.x: no recompute tail, block reuse off
    (QWEN, ["backend.trtllm_version=1.4.0rc1"], "kv"),  # 1.4: reuse with a recompute tail
    (GPT_OSS, ["backend.trtllm_version=1.4.0rc1"], "round-robin"),  # sliding-window layers: reuse stays off
])
def test_the_kv_router_only_where_prefix_blocks_are_reused(path, overrides, mode):
    from trtllm_dflash.deploy.llmapi import llm_args

    recipe = load_recipe(path, overrides)
    assert dynamo.router(recipe)[0] == mode
    reuse = llm_args(recipe, Path("/a"))["kv_cache_config"]["enable_block_reuse"]
    assert reuse == (mode == "kv")


def test_the_schema_names_its_source_and_what_is_unconfirmed():
    import jsonschema

    schema = dynamo.dgd_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    src = schema["x-source"]
    assert src["repo"] == "ai-dynamo/dynamo" and re.fullmatch(r"[0-9a-f]{40}", src["commit"])
    assert src["path"].endswith("nvidia.com_dynamographdeployments.yaml") and "UNCONFIRMED" in src["pinned_tag"]
    assert schema["properties"]["apiVersion"] == {"const": dynamo.DGD_API}
