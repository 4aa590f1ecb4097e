"""The drafter's pass in the round after a request joins a running batch, over its steady pass.

    python -m trtllm_dflash.perf.bench_drafter_context [--batches 1,4,16] [--draft-len 3]
        [--rounds 20] [--work DIR]

Each round the drafter first projects the context rows it has not seen into every layer's K/V:
the positions each running request's last round accepted (a few), and for a request that has
just joined, its whole prompt. Stacked as [B, longest, F], every other request's padding was
projected too: at 16 requests on the 2-core CPU the round after a join drafted in 2.30x the
steady pass's time (9.55 against 4.15 ms, the embedded recipe at 3 drafts, 2026-11-27), and at
c = 16 a request joins every round or two. DFlashDraft.forward now projects only the real rows
(1.19x: 4.98 against 4.19 ms).

Deploys the embedded CPU recipe, then per batch size runs a reference decoder of that many
requests at `--draft-len`: each repeat times a steady round, then one request leaves, a new one
(a prompt of the recipe's input length) joins, and the next round is timed. Prints the drafter's
median milliseconds, steady and after a join, and their ratio (1.0: a join costs the drafter
nothing beyond its own rows).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def join_rounds(model, spec, vocab: int, batch: int, draft_len: int, rounds: int, prompt_len: int,
                seed: int = 0) -> tuple[list[float], list[float]]:
    """(drafter seconds of steady rounds, of rounds right after a join), `rounds` of each, at
    `batch` running requests of a `model.decoder` (random prompts of `prompt_len` tokens)."""
    import torch

    from trtllm_dflash.reference.verify import SamplingParams

    g = torch.Generator().manual_seed(seed)
    new = 8 * spec.block_size * (rounds + 4)  # never finishes
    decoder = model.decoder(sampling=SamplingParams(), mode="dflash", block_size=spec.block_size,
                            ddtree_budget=spec.ddtree_budget, max_len=prompt_len + new)

    def prompts(n):
        return torch.randint(0, vocab, (n, prompt_len), generator=g).tolist()

    from trtllm_dflash.policy.decision import Drafts

    drafts = Drafts.of(draft_len)
    try:
        decoder.admit(list(range(batch)), prompts(batch), [new] * batch, [[]] * batch)
        for _ in range(3):  # warm-up: the first rounds after the prefill
            decoder.step(drafts)
        steady, joined = [], []
        for i in range(rounds):
            steady.append(decoder.step(drafts).t_draft)
            decoder.cancel([decoder.st.rows[0]])  # the oldest leaves, a new request joins
            decoder.admit([batch + i], prompts(1), [new], [[]])
            joined.append(decoder.step(drafts).t_draft)
    finally:
        model.release(decoder)
    return steady, joined


def bench(work: Path, batches, draft_len: int, rounds: int) -> list[dict]:
    from trtllm_dflash import pipeline
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.serve.deployed import open_deployed, repository_model

    recipe = load_recipe(None, [])
    pipeline.run(recipe, work, until="deploy", progress=False, say=lambda _: None)
    deployed = open_deployed(*repository_model(work / "deploy", recipe.serve.model_name))  # as served: its threads
    deployed.engine.stop()  # only the model is used
    rows = []
    try:
        for B in batches:
            steady, joined = join_rounds(deployed.model, recipe.speculative, recipe.target_facts.vocab_size, B,
                                         draft_len, rounds, recipe.sweep.input_len)
            s, j = statistics.median(steady), statistics.median(joined)
            rows.append({"batch": B, "draft_len": draft_len, "steady_ms": s * 1e3, "after_join_ms": j * 1e3,
                         "ratio": j / s})
    finally:
        deployed.close()
    return rows


def main(argv=None) -> int:
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=ints, default=[1, 4, 16])
    p.add_argument("--draft-len", type=int, default=3)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.draft_len < 1 or min(args.batches) < 1:
        p.error(f"--rounds {args.rounds}, --draft-len {args.draft_len}, --batches {args.batches}: each must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(args.work or Path(tmp), args.batches, args.draft_len, args.rounds)
    print(f"drafter pass at {args.draft_len} drafts, median of {args.rounds} rounds each")
    print("requests   steady ms   after a join ms   after / steady")
    for r in rows:
        print(f"{r['batch']:<8}{r['steady_ms']:12.2f}{r['after_join_ms']:18.2f}{r['ratio']:17.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
