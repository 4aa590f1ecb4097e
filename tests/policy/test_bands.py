"""The band rule is defined once (policy/bands.py band_draft_len) and every consumer of
`speculative.draft_len` bands answers with it: the schema, the serving `Bands` policy, the
TensorRT-LLM draft_len_schedule and the LLM-API deploy's max_draft_len."""

import re
from pathlib import Path

import pytest

from trtllm_dflash.policy.bands import Bands, band_draft_len
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.rules import MIN_RUNTIME_DRAFT_LEN, pytorch_draft_len_schedule

ROOT = Path(__file__).resolve().parents[2]
HOME = "trtllm_dflash/policy/bands.py"
# what writing the rule again takes: a request count compared with a band's upper limit, or a
# fall-back to the last band's draft length
SIGNS = (re.compile(r"\bconcurrency\s*<="), re.compile(r"<=\s*[\w.\[\]]*\bmax_concurrency\b"),
         re.compile(r"return\b.*\bbands\[-1\]"))


def band_rule_sites(root: Path) -> list[str]:
    """path:line of every line in the package, its plugins and perf/ that looks like the band rule."""
    out = []
    for top in ("trtllm_dflash", "plugins", "perf"):
        for path in sorted((root / top).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if any(s.search(line) for s in SIGNS):
                    out.append(f"{path.relative_to(root)}:{n}")
    return out


def test_the_band_rule_is_written_once():
    sites = band_rule_sites(ROOT)
    assert sites and all(s.startswith(HOME + ":") for s in sites), (
        f"the band rule outside {HOME}: {[s for s in sites if not s.startswith(HOME)]}; call band_draft_len instead")


def test_the_rule():
    bands = [(1, 15), (8, 4), (64, 0)]
    assert [band_draft_len(bands, c, 16) for c in (1, 2, 8, 9, 64, 100)] == [15, 4, 4, 0, 0, 0]
    assert band_draft_len([], 5, 8) == 7  # no bands: the whole block
    assert Bands(bands, 16).decide([0, 1], 5, "dflash").length == 4


@pytest.mark.parametrize("bands", ["[]", "[{max_concurrency: 2, draft_len: 7}, {max_concurrency: 8, draft_len: 3}]",
                                   "[{max_concurrency: 1, draft_len: 15}, {max_concurrency: 16, draft_len: 1}]"])
def test_every_consumer_answers_with_the_rule(bands):
    recipe = load_recipe(None, [f"speculative.draft_len={bands}", "speculative.ddtree_budget=null"], check_rules=False)
    spec = recipe.speculative
    policy = Bands(spec.band_pairs, spec.block_size)
    for c in range(1, recipe.build.max_batch_size + 4):
        assert spec.draft_len_at(c) == policy.choose([], c) == band_draft_len(spec.band_pairs, c, spec.block_size)
    schedule = pytorch_draft_len_schedule(recipe)
    for limit, _ in spec.band_pairs:
        assert schedule[limit] == max(spec.draft_len_at(limit), MIN_RUNTIME_DRAFT_LEN)
