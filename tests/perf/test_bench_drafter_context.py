"""perf/bench_drafter_context: each repeat times a steady round, then the oldest request leaves, a new
one joins, and the round after it is timed: the one whose drafter pass projects the new prompt."""

from types import SimpleNamespace

from serve_helpers import make_pair
from trtllm_dflash.perf.bench_drafter_context import join_rounds
from trtllm_dflash.reference import load_pair
from trtllm_dflash.runtime.local_model import LocalModel


def test_join_rounds_replace_the_oldest_request_and_time_the_round_that_projects_its_prompt(tmp_path):
    target, drafter = load_pair(*make_pair(tmp_path))
    model, made, projected = LocalModel(target, drafter), [], []
    decoder = model.decoder
    model.decoder = lambda **kw: made.append(decoder(**kw)) or made[-1]  # LocalModel.release keeps its state
    drafter.fc.register_forward_hook(lambda _m, args, _out: projected.append(args[0].shape[:-1].numel()))
    spec = SimpleNamespace(block_size=drafter.block_size, ddtree_budget=None)
    steady, joined = join_rounds(model, spec, target.cfg.vocab_size, batch=3, draft_len=2, rounds=4, prompt_len=20)
    assert len(steady) == len(joined) == 4 and min(steady + joined) > 0
    assert made[0].st.rows == [4, 5, 6]  # requests 0-2 left in turn, 3-6 joined
    # drafter passes: 3 warm-up rounds, then per repeat a steady one and the one after the join
    # (the first warm-up projects the three prompts; each timed join round the new one's 20 rows)
    timed = projected[3:]
    assert len(timed) == 8 and all(n >= 20 for n in timed[1::2]) and all(n <= 3 * 3 for n in timed[0::2])
