"""`sweep --tune`: the best static draft length per concurrency level, as recipe bands.

The sweep measured the server's own policy (curve "<mode>": the recipe's bands or `auto`) beside
fixed draft lengths ("<mode> L=<n>", the per-request draft_len) at every level, `repeats` times
interleaved. Per level the draft length with the highest median output tokens/s wins (at one
concurrency, throughput and tokens/s/user rise and fall together); consecutive levels with the
same winner merge into one band up to the last of them. The snippet (draft_len.yaml) is YAML for
`speculative.draft_len`, and its comment has the `--set` form that `check` and `run` take.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from trtllm_dflash.sweep.metrics import LevelSummary

if TYPE_CHECKING:  # annotations only: the projection imports best_bands without the load generator
    from trtllm_dflash.sweep.loadgen import Variant


def fixed_curve(mode: str, draft_len: int) -> str:
    """The name of the curve of `mode` at a fixed per-request draft length."""
    return f"{mode} L={draft_len}"


def best_bands(best: dict[int, int]) -> list[dict]:
    """{level: draft length} -> bands [{max_concurrency, draft_len}], merging equal neighbours."""
    bands: list[dict] = []
    for c in sorted(best):
        if bands and bands[-1]["draft_len"] == best[c]:
            bands[-1]["max_concurrency"] = c
        else:
            bands.append({"max_concurrency": c, "draft_len": best[c]})
    return bands


def tune_summary(runs: dict[tuple[str, int], list[LevelSummary]], variants: list[Variant], levels: list[int]) -> dict:
    """The tune section of summary.json: output tokens/s per repeat and their medians for every
    curve and level, the best fixed draft length per level, the bands, and the server's policy
    against the best fixed length (ratio of medians) with the drafts per round it chose."""
    fixed = [v for v in variants if v.draft_len is not None]
    policy = next(v for v in variants if v.draft_len is None)
    tok_s = {v.name: {str(c): [r.output_tok_s for r in runs[(v.name, c)]] for c in levels} for v in variants}
    med = {name: {c: statistics.median(xs) for c, xs in per.items()} for name, per in tok_s.items()}
    best = {}
    for c in levels:
        v = max(fixed, key=lambda v: (med[v.name][str(c)], -v.draft_len))  # ties: the shorter draft
        best[c] = v
    return {
        "levels": levels,
        "draft_lens": [v.draft_len for v in fixed],
        "policy": policy.name,
        "output_tok_s": tok_s,
        "median_output_tok_s": med,
        "best": {str(c): {"draft_len": v.draft_len, "output_tok_s": med[v.name][str(c)]} for c, v in best.items()},
        "bands": best_bands({c: v.draft_len for c, v in best.items()}),
        "policy_over_best": {str(c): med[policy.name][str(c)] / med[v.name][str(c)] for c, v in best.items()
                             if med[v.name][str(c)] > 0},
        "policy_draft_per_round": {str(c): [r.draft_per_round for r in runs[(policy.name, c)]] for c in levels},
    }


def set_argument(bands: list[dict]) -> str:
    """The bands as one `--set` argument."""
    flow = ", ".join(f"{{max_concurrency: {b['max_concurrency']}, draft_len: {b['draft_len']}}}" for b in bands)
    return f"speculative.draft_len=[{flow}]"


def write_snippet(path: Path, tune: dict, recipe) -> Path:
    n = len(next(iter(tune["output_tok_s"].values()))[str(tune["levels"][0])])
    lines = [
        f"# speculative.draft_len tuned by `trtllm-dflash sweep --tune` for recipe {recipe.name!r}:",
        f"# per concurrency level ({', '.join(map(str, tune['levels']))}) the draft length of highest output tokens/s",
        f"# among {', '.join(map(str, tune['draft_lens']))} (median of {n} repeat{'s' * (n > 1)}).",
        "# Merge it into the recipe, or pass it as an override:",
        f"#   trtllm-dflash check RECIPE --set '{set_argument(tune['bands'])}'",
    ]
    body = yaml.safe_dump({"speculative": {"draft_len": tune["bands"]}}, sort_keys=False, default_flow_style=None)
    Path(path).write_text("\n".join(lines) + "\n" + body)
    return Path(path)
