"""`profile`'s report: acceptance on the user's own prompts, per category and overall.

The decoding is the deployment's (runtime/acceptance.py decode_rounds over the deployed
checkpoint); this module only summarizes what it returns (objects with `rounds` = [(accepted,
drafted)], `verify_passes`, `tokens`, `seconds`, `tau`, `tokens_per_s`), one DFlash decode and
one AR decode per category. Each category's entry is an acceptance profile in the shape
`project --acceptance` reads (project/acceptance.py: `conditional_acceptance`), plus:

  tau                       tokens committed per verify pass, from the profile (full-draft rounds)
  tau_decoded               the same measured over every verify pass of the decode
  accepted_per_round        accepted draft tokens per verify pass (tau_decoded - 1)
  acceptance_by_position    share of the rounds drafting position j whose draft j was accepted
  dflash_tok_s, ar_tok_s    decode tokens/s of the same prompts, DFlash and plain decoding
  speedup                   dflash_tok_s / ar_tok_s
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_dflash.errors import UserError
from trtllm_dflash.project.acceptance import AcceptanceProfile

OVERALL = "overall"


def by_position(rounds: list[tuple[int, int]], max_draft_len: int) -> list[float | None]:
    """Per position j = 1..max_draft_len: accepted / drafted there (None where nothing was drafted)."""
    out = []
    for j in range(1, max_draft_len + 1):
        drafted = sum(d >= j for _, d in rounds)
        out.append(sum(a >= j and d >= j for a, d in rounds) / drafted if drafted else None)
    return out


def entry(name: str, dflash, ar, prompts: int, max_draft_len: int, source: str) -> dict:
    """One category's (or the overall) JSON entry."""
    try:
        prof = AcceptanceProfile.from_rounds(dflash.rounds, max_draft_len, f"{source}: {name}", task=name)
        shape = prof.to_json()
    except UserError:  # every round was cut by a length limit or a stop token
        shape = {"source": f"{source}: {name}", "task": name, "conditional_acceptance": None, "tau": None}
    speedup = dflash.tokens_per_s / ar.tokens_per_s if dflash.tokens_per_s and ar.tokens_per_s else None
    return {
        **shape,
        "prompts": prompts, "rounds": dflash.verify_passes, "tau_decoded": dflash.tau,
        "accepted_per_round": dflash.tau - 1 if dflash.tau else None,
        "acceptance_by_position": by_position(dflash.rounds, max_draft_len),
        "dflash_tok_s": dflash.tokens_per_s, "ar_tok_s": ar.tokens_per_s, "speedup": speedup,
    }


def report(categories: dict[str, tuple], meta: dict, max_draft_len: int, source: str) -> dict:
    """categories: name -> (dflash decode, ar decode, prompts); the overall pools every category."""
    from types import SimpleNamespace

    def pooled(i):
        ds = [c[i] for c in categories.values()]
        return SimpleNamespace(
            rounds=[r for d in ds for r in d.rounds], verify_passes=sum(d.verify_passes for d in ds),
            tokens=sum(d.tokens for d in ds), seconds=sum(d.seconds for d in ds),
            tau=(sum(d.tokens for d in ds) / sum(d.verify_passes for d in ds)) if any(d.verify_passes for d in ds)
            else None,
            tokens_per_s=(sum(d.tokens for d in ds) / sum(d.seconds for d in ds)) if sum(d.seconds for d in ds) > 0
            else None)

    prompts = sum(c[2] for c in categories.values())
    return {
        **meta, "max_draft_len": max_draft_len,
        OVERALL: entry(OVERALL, pooled(0), pooled(1), prompts, max_draft_len, source),
        "categories": {name: entry(name, *c, max_draft_len, source) for name, c in categories.items()},
    }


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(rep: dict):
    from rich.table import Table

    t = Table(title=f"{rep['recipe']}: acceptance on {rep['prompts_file']} ({rep['max_new_tokens']} greedy tokens, "
                    f"block {rep['block_size']})")
    for col in ("category", "prompts", "tau", "accepted/round", "acceptance by position", "DFlash tok/s",
                "AR tok/s", "speedup"):
        t.add_column(col, justify="left" if col in ("category", "acceptance by position") else "right")
    rows = [*rep["categories"].items(), (OVERALL, rep[OVERALL])]
    for name, e in rows:
        pos = " ".join(_f(a, ".2f") for a in e["acceptance_by_position"][:8])
        t.add_row(name, str(e["prompts"]), _f(e["tau_decoded"], ".2f"), _f(e["accepted_per_round"], ".2f"), pos,
                  _f(e["dflash_tok_s"], ".1f"), _f(e["ar_tok_s"], ".1f"), _f(e["speedup"], ".2f"))
    t.caption = ("tau = tokens per verify pass (bonus counted); acceptance by position: positions 1..8, share of the "
                 "rounds drafting there that kept the draft; tok/s of this machine's decode of the same prompts")
    return t


def plot(rep: dict, path: Path) -> Path:
    """Per-position acceptance per category (and overall), one line each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, e in [*rep["categories"].items(), (OVERALL, rep[OVERALL])]:
        ys = e["acceptance_by_position"]
        xs = [j for j, y in enumerate(ys, start=1) if y is not None]
        ax.plot(xs, [y for y in ys if y is not None], marker="o", linewidth=2.5 if name == OVERALL else 1.2,
                linestyle="--" if name == OVERALL else "-", label=f"{name} (tau {_f(e['tau_decoded'], '.2f')})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (accepted / drafted)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{rep['recipe']}: per-position acceptance")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(rep: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "profile.json", "png": out / "profile.png"}
    paths["json"].write_text(json.dumps(rep, indent=2))
    plot(rep, paths["png"])
    return paths
