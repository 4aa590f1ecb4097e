"""Acceptance profiles: tau from per-slot acceptance, published entries, files, and the
measurement on the shipped tiny pair."""

import json
from pathlib import Path

import pytest

from trtllm_dflash.errors import UserError
from trtllm_dflash.project import acceptance
from trtllm_dflash.project.acceptance import AcceptanceProfile
from trtllm_dflash.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_tau_is_one_plus_the_sum_of_survival_products():
    p = AcceptanceProfile((0.8, 0.5, 0.25), "hand")
    assert p.tau(0) == 1.0
    assert p.tau(1) == pytest.approx(1.8)
    assert p.tau(3) == pytest.approx(1 + 0.8 + 0.4 + 0.1)
    with pytest.raises(UserError, match="covers 1..3 draft slots"):
        p.tau(4)
    with pytest.raises(ValueError):
        AcceptanceProfile((1.2,), "bad")


def test_geometric_profile_reproduces_its_tau():
    p = AcceptanceProfile.geometric(8.01, 15, "paper", "math500")
    assert p.tau(15) == pytest.approx(8.01, abs=1e-9)
    assert len(set(p.conditional)) == 1 and "geometric" in p.source and p.task == "math500"
    assert AcceptanceProfile.geometric(1.0, 5, "x").tau(5) == pytest.approx(1.0)
    with pytest.raises(UserError, match=r"must be in \[1, 4\]"):
        AcceptanceProfile.geometric(4.5, 3, "x")


def test_profile_from_rounds_counts_reached_and_accepted_slots():
    # (accepted drafts, drafted slots): 3 full rounds of 3 drafts, one short round of 1 draft.
    rounds = [(3, 3), (1, 3), (0, 3), (1, 1)]
    p = AcceptanceProfile.from_rounds(rounds, 3, "synthetic")
    assert p.reached == (4, 2, 1) and p.accepted == (3, 1, 1)
    assert p.conditional == (0.75, 0.5, 1.0)
    with pytest.raises(UserError, match="no verify round drafted"):
        AcceptanceProfile.from_rounds([(0, 0)], 3, "empty")


def test_published_entries_carry_their_sources():
    r = load_recipe(RECIPES / "blackwell" / "b300x8-gpt-oss-120b-nvfp4.yaml")
    p = acceptance.published(r)  # the drafter's default task
    assert p.task == "humaneval" and p.tau(9) == pytest.approx(4.4) and "model card" in p.source
    q = load_recipe(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml")
    assert acceptance.published(q, "trtllm-coding").tau(7) == pytest.approx(4.7)
    assert "PR #16914" in acceptance.published(q, "trtllm-coding").source
    with pytest.raises(UserError, match="has published acceptance for: .*mt-bench"):
        acceptance.published(q, "poetry")
    for entry in acceptance.published_catalog().values():
        for task, e in entry.tasks.items():
            assert e.source and e.profile(task).tau(e.draft_len or len(e.conditional)) >= 1


def test_a_drafter_without_published_acceptance_says_how_to_measure_one(monkeypatch):
    r = load_recipe(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml")
    monkeypatch.setattr(acceptance, "drafter_key", lambda recipe: "my-own-drafter")
    with pytest.raises(UserError, match="'my-own-drafter' has no published acceptance.*bench acceptance RECIPE --json"):
        acceptance.resolve(r, None)


def test_files_from_bench_acceptance_and_published_figures(tmp_path):
    r = load_recipe(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml")
    bench = tmp_path / "acc.json"
    bench.write_text("some log line\n" + json.dumps(AcceptanceProfile((0.9, 0.6), "bench").to_json()) + "\n")
    p = acceptance.resolve(r, str(bench))
    assert p.conditional == (0.9, 0.6) and p.source == "bench"
    pub = tmp_path / "pub.yaml"
    pub.write_text("tau: 3.5\ndraft_len: 7\nsource: my measurement\n")
    assert acceptance.resolve(r, str(pub)).tau(7) == pytest.approx(3.5)
    assert acceptance.resolve(r, "mt-bench").tau(15) == pytest.approx(4.25)


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON or YAML"),
    ("[1, 2]", "expected a mapping"),
    ("tau: 3.0\n", "needs tau and draft_len"),
    ("tau: 0.5\ndraft_len: 3\n", "tau: Input should be greater than or equal to 1"),
    ('{"conditional_acceptance": []}', "non-empty list"),
    ('{"conditional_acceptance": [1.5]}', r"must be in \[0, 1\]"),
])
def test_bad_profile_files_get_one_line_naming_the_file(tmp_path, content, message):
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    with pytest.raises(UserError, match=message) as e:
        acceptance.read_profile(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="file not found"):
        acceptance.read_profile(tmp_path / "missing.json")


@pytest.fixture
def one_thread():
    """One torch thread: a 2-thread decode on a shared 2-core machine stalls on spinning threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_measured_on_the_tiny_pair_matches_the_decoders_own_tau(one_thread):
    """Decode 3 held-out prompts; tau from the per-slot profile equals committed tokens / verify
    passes over the same rounds (the last round of each request left out)."""
    from trtllm_dflash.prompts.sources import heldout_token_prompts
    from trtllm_dflash.reference import generate_steps, load_pair

    r = load_recipe(None)
    p = acceptance.measure(r, prompts=3, prompt_len=48, max_new_tokens=40, threads=1)
    assert p.max_draft_len == 15 and all(0 <= a <= 1 for a in p.conditional)
    assert p.reached[0] >= p.reached[1] >= p.reached[-1] and p.extra["rounds"] > 3
    target, drafter = load_pair(r.target.path, r.drafter.path)
    committed = passes = 0
    for rec in generate_steps(target, drafter, heldout_token_prompts(r.target.path, 3, 48), 40, mode="dflash",
                              block_size=16, stop_token_ids=[]):
        for toks, done in zip(rec.tokens, rec.finished):
            if rec.round and done is None:
                committed, passes = committed + len(toks), passes + 1
    assert passes == p.extra["rounds"]
    assert p.tau(15) == pytest.approx(committed / passes, rel=1e-9)
    assert p.tau(15) > 2  # the shipped pair drafts well on held-out text


def test_measure_needs_local_checkpoints():
    r = load_recipe(RECIPES / "hopper" / "h100-qwen3-8b-fp8.yaml")
    with pytest.raises(UserError, match="not a local checkpoint"):
        acceptance.measure(r)
