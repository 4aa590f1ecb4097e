"""64 concurrent streaming clients for 2 minutes: no failed, truncated or wrong response (slow)."""

import pytest

from serve_helpers import make_pair, write_recipe

pytest.importorskip("pytriton", reason="needs nvidia-pytriton (the serve extra) for its bundled tritonserver")


@pytest.mark.slow
def test_64_clients_for_two_minutes(tmp_path):
    from trtllm_dflash.perf.soak import soak
    from trtllm_dflash.prompts.sources import load_prompts
    from trtllm_dflash.recipe import load_recipe

    make_pair(tmp_path)
    recipe = load_recipe(write_recipe(tmp_path, build__max_batch_size=64, build__max_num_tokens=1024),
                         check_rules=False)
    prompts = load_prompts("random", 16, 24, seed=0)
    stats = soak(recipe, clients=64, seconds=120, max_tokens=24, prompts=prompts)
    assert stats["requests"] >= 64 and stats["seconds"] >= 120
    assert (stats["failed"], stats["truncated"], stats["mismatched"]) == (0, 0, 0), stats
