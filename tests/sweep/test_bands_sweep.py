"""A recipe whose draft-length bands turn speculation off above concurrency 1, swept by `run`
(convert, deploy, tritonserver, sweep): the server's DFlash curve has the pair's own tau at
c = 1 (block_size - 1 drafts, every round as `generate`'s) and tau ~ 1 at c = 2, where the band
says 0 drafts; the AR curve of the same sweep is tau 1 everywhere."""

import json

import pytest

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")

from trtllm_dflash import pipeline  # noqa: E402
from trtllm_dflash.prompts.sources import load_prompts  # noqa: E402
from trtllm_dflash.recipe import load_recipe  # noqa: E402
from trtllm_dflash.reference import generate, load_pair, pooled_tau  # noqa: E402

OFF_ABOVE_1 = ["speculative.draft_len=[{max_concurrency: 1, draft_len: 15}, {max_concurrency: 64, draft_len: 0}]",
               "speculative.ddtree_budget=null", "sweep.concurrency=[1,2]", "sweep.min_requests=1",
               "sweep.warmup_requests=0", "sweep.output_len=20"]


@pytest.mark.slow
def test_bands_that_turn_speculation_off_above_concurrency_1(tmp_path):
    from transformers import AutoTokenizer

    recipe = load_recipe(None, OFF_ABOVE_1)
    pipeline.run(recipe, tmp_path, progress=False, say=lambda _: None)
    levels = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    tau = {(lv["curve"], lv["concurrency"]): lv["tau"] for lv in levels}
    drafts = {(lv["curve"], lv["concurrency"]): lv["draft_per_round"] for lv in levels}
    assert all(lv["failed"] == 0 for lv in levels)
    # c = 1: what the pair decodes alone at block_size - 1 drafts, request by request.
    sw = recipe.sweep
    prompts = load_prompts(sw.dataset, sw.requests_at(2), sw.input_len, sw.seed)[: sw.requests_at(1)]
    tok = AutoTokenizer.from_pretrained(recipe.target.path)
    target, drafter = load_pair(recipe.target.path, recipe.drafter.path)
    gens = [generate(target, drafter, [tok(p)["input_ids"]], sw.output_len, block_size=16)[0] for p in prompts]
    original = pooled_tau(gens)  # tokens from verify passes / verify passes, as the sweep counts
    assert original > 1.5  # the shipped pair accepts: well above the c = 2 bound below, so the band shows
    assert tau[("dflash", 1)] == pytest.approx(original) and drafts[("dflash", 1)] > 5  # (short last rounds draft less)
    # c = 2: the band says no drafts. A round that finds one request alone (the other between requests) drafts 15.
    assert tau[("dflash", 2)] < 1.25 and drafts[("dflash", 2)] < 2.0
    assert tau[("ar", 1)] == tau[("ar", 2)] == 1.0
