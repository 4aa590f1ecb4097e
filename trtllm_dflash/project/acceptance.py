"""Acceptance profiles: how many drafted tokens the target keeps, slot by slot.

A profile is the conditional acceptance of every draft slot,

    a_j = P(slot j accepted | slots 1..j-1 accepted),   j = 1 .. K_max,

from which the acceptance length at any draft length K <= K_max follows:

    tau(K) = 1 + sum_{j=1..K} prod_{i=1..j} a_i          (tokens committed per verify pass, bonus included)

Where profiles come from, each with its source recorded:
- measured by the reference backend on held-out prompts (`measure`, `trtllm-dflash bench
  acceptance RECIPE --json`): every verify round of a greedy DFlash decode gives the slots it
  reached and the slots it accepted;
- published acceptance lengths (recipe/catalog/acceptance.yaml: the DFlash paper's and model
  cards' tau per task, TensorRT-LLM's acceptance length per category). A published tau at one
  draft length fixes one number, not a curve; we assume the same conditional acceptance a at
  every slot (the i.i.d. acceptance of Leviathan et al.), solve tau = (1 - a^(K+1)) / (1 - a)
  for a, and say so in the profile's source. Measured profiles fall off with the slot instead,
  so a geometric profile overstates tau at short drafts a little when it is fitted at a long one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.errors import UserError


@dataclass(frozen=True)
class AcceptanceProfile:
    """Conditional acceptance per draft slot (index 0 = slot 1) and where it came from."""

    conditional: tuple[float, ...]
    source: str
    task: str = ""
    reached: tuple[int, ...] = ()  # measured profiles: rounds that verified each slot
    accepted: tuple[int, ...] = ()  # ... and that accepted it
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.conditional:
            raise ValueError("an acceptance profile needs at least one slot")
        if any(not 0.0 <= a <= 1.0 for a in self.conditional):
            raise ValueError(f"conditional acceptances must be in [0, 1], got {self.conditional}")

    @property
    def max_draft_len(self) -> int:
        return len(self.conditional)

    def tau(self, draft_len: int) -> float:
        """Acceptance length at draft length K (1.0 at K = 0, i.e. AR)."""
        if draft_len < 0 or draft_len > self.max_draft_len:
            raise UserError(f"draft length {draft_len}: the acceptance profile ({self.source}) covers "
                            f"1..{self.max_draft_len} draft slots")
        tau, keep = 1.0, 1.0
        for a in self.conditional[:draft_len]:
            keep *= a
            tau += keep
        return tau

    @classmethod
    def geometric(cls, tau: float, draft_len: int, source: str, task: str = "") -> AcceptanceProfile:
        """The constant-acceptance profile with acceptance length `tau` at `draft_len` slots."""
        if not 1.0 <= tau <= draft_len + 1:
            raise UserError(f"tau {tau} at draft length {draft_len}: must be in [1, {draft_len + 1}]")
        lo, hi = 0.0, 1.0
        for _ in range(100):  # bisection: tau(a) increases with a
            mid = (lo + hi) / 2
            if sum(mid**j for j in range(draft_len + 1)) < tau:
                lo = mid
            else:
                hi = mid
        a = (lo + hi) / 2
        return cls((a,) * draft_len, f"{source}; geometric profile (same acceptance {a:.3f} at every slot) "
                   f"fitted to tau {tau:g} at draft length {draft_len}", task)

    @classmethod
    def from_rounds(cls, rounds: Sequence[tuple[int, int]], max_draft_len: int, source: str,
                    task: str = "") -> AcceptanceProfile:
        """From verify rounds (accepted drafts, drafted slots): slot j was reached when the round
        drafted it and accepted at least j-1 drafts, and accepted when it accepted at least j."""
        reached, acc = [0] * max_draft_len, [0] * max_draft_len
        for a, d in rounds:
            for j in range(1, min(d, max_draft_len) + 1):
                if a >= j - 1:
                    reached[j - 1] += 1
                    acc[j - 1] += a >= j
        if not reached[0]:
            raise UserError(f"{source}: no verify round drafted a token; nothing to measure")
        cond = tuple(acc[j] / reached[j] if reached[j] else 0.0 for j in range(max_draft_len))
        return cls(cond, source, task, tuple(reached), tuple(acc))

    def to_json(self) -> dict:
        return {
            "source": self.source, "task": self.task, "max_draft_len": self.max_draft_len,
            "tau": self.tau(self.max_draft_len),
            "tau_by_draft_len": {str(k): self.tau(k) for k in range(1, self.max_draft_len + 1)},
            "conditional_acceptance": list(self.conditional),
            **({"reached": list(self.reached), "accepted": list(self.accepted)} if self.reached else {}),
            **self.extra,
        }


# ----------------------------------------------------------------------------- reading


class _Published(BaseModel):
    """One catalog entry: a published tau at a draft length, or a measured per-slot profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    tau: float | None = Field(default=None, ge=1)
    draft_len: int | None = Field(default=None, ge=1)
    conditional: list[float] | None = None
    note: str = ""

    def profile(self, task: str) -> AcceptanceProfile:
        if self.conditional:
            return AcceptanceProfile(tuple(self.conditional), self.source, task)
        if self.tau is None or self.draft_len is None:
            raise ValueError("needs tau and draft_len, or conditional")
        return AcceptanceProfile.geometric(self.tau, self.draft_len, self.source, task)


class _DrafterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: str
    tasks: dict[str, _Published]


@lru_cache(maxsize=1)
def published_catalog() -> dict[str, _DrafterEntry]:
    """recipe/catalog/acceptance.yaml: drafter (catalog name or source) -> tasks."""
    text = resources.files("trtllm_dflash.recipe.catalog").joinpath("acceptance.yaml").read_text()
    return {k: _DrafterEntry(**v) for k, v in yaml.safe_load(text).items()}


def drafter_key(recipe) -> str:
    """The catalog key of a recipe's drafter: its catalog name, else its source."""
    arch = recipe.drafter.arch
    return arch if isinstance(arch, str) else recipe.drafter.source


def published(recipe, task: str | None = None) -> AcceptanceProfile:
    """The catalog profile of the recipe's drafter for `task` (default: the entry's default task)."""
    key = drafter_key(recipe)
    entry = published_catalog().get(key)
    if entry is None:
        raise UserError(f"drafter {key!r} has no published acceptance in the catalog; measure one with "
                        f"`trtllm-dflash bench acceptance RECIPE --json > acceptance.json` and pass --acceptance "
                        f"acceptance.json")
    task = task or entry.default
    if task not in entry.tasks:
        raise UserError(f"--acceptance {task}: drafter {key!r} has published acceptance for: "
                        f"{', '.join(entry.tasks)} (or give a JSON file)")
    return entry.tasks[task].profile(task)


def read_profile(path: Path, category: str | None = None) -> AcceptanceProfile:
    """A profile file: the JSON `bench acceptance --json` prints (conditional_acceptance), `profile`'s
    profile.json (its `overall` entry, or the entry of `category`), or a JSON / YAML mapping with
    `tau` and `draft_len` (published figures) and a `source`."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UserError(f"--acceptance {path}: file not found") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise UserError(f"--acceptance {path}: not a JSON or YAML text file") from None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    try:
        data = json.loads(lines[-1]) if lines and lines[-1].lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise UserError(f"--acceptance {path}: not valid JSON or YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UserError(f"--acceptance {path}: expected a mapping with conditional_acceptance, or tau and draft_len")
    data = _profile_entry(data, path, category)
    cond = data.get("conditional_acceptance", data.get("conditional"))
    try:
        if cond is not None:
            if not isinstance(cond, list) or not cond:
                raise UserError(f"--acceptance {path}: conditional_acceptance must be a non-empty list of numbers")
            return AcceptanceProfile(tuple(float(a) for a in cond), str(data.get("source", path)),
                                     str(data.get("task", "")),
                                     tuple(data.get("reached", ())), tuple(data.get("accepted", ())))
        entry = _Published(**{k: data[k] for k in ("source", "tau", "draft_len", "note") if k in data} |
                           ({} if "source" in data else {"source": str(path)}))
        return entry.profile(str(data.get("task", "")))
    except (ValueError, TypeError, ValidationError) as e:
        msg = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        field_ = ".".join(str(p) for p in e.errors()[0]["loc"]) if isinstance(e, ValidationError) else ""
        raise UserError(f"--acceptance {path}: {field_ + ': ' if field_ else ''}{msg}") from None


def _profile_entry(data: dict, path: Path, category: str | None) -> dict:
    """The entry of `profile`'s JSON that --acceptance means: `overall`, or --category's."""
    if "categories" not in data or "overall" not in data:
        if category is not None:
            raise UserError(f"--category {category}: {path} is not a `profile` output (no categories)")
        return data
    if category is None:
        entry = data["overall"]
    elif category in data["categories"]:
        entry = data["categories"][category]
    else:
        raise UserError(f"--category {category}: {path} profiled the categories {', '.join(data['categories'])}")
    if entry.get("conditional_acceptance") is None:
        raise UserError(f"--acceptance {path}: {category or 'overall'}: no verify round drafted a full block; "
                        "profile again with a larger --max-new-tokens")
    return entry


def resolve(recipe, spec: str | None, category: str | None = None) -> AcceptanceProfile:
    """--acceptance: a file path, a published task name, or None (the drafter's default task);
    `category`: which category of a `profile` output (default its overall)."""
    if spec is not None and (Path(spec).exists() or spec.endswith((".json", ".yaml", ".yml"))):
        return read_profile(Path(spec), category)
    if category is not None:
        raise UserError(f"--category {category}: needs --acceptance PROFILE.json (a `profile` output)")
    return published(recipe, spec)


# ----------------------------------------------------------------------------- measuring


def measure(recipe, *, prompts: int = 8, prompt_len: int = 64, max_new_tokens: int = 128,
            block_size: int | None = None, threads: int | None = None) -> AcceptanceProfile:
    """Decode held-out prompts greedily with the reference backend (DFlash, one batch) and read
    the per-slot acceptance off the verify rounds (the last round of a request is left out when
    the length limit or a stop token cut its committed tokens)."""
    import torch

    from trtllm_dflash.prompts.sources import heldout_token_prompts
    from trtllm_dflash.reference import generate_steps, load_pair

    tdir, ddir = recipe.target.path, recipe.drafter.path
    for name, d in (("target", tdir), ("drafter", ddir)):
        if d is None or not (d / "config.json").is_file():
            raise UserError(f"{recipe.name}: {name}.source {getattr(recipe, name).source!r} is not a local checkpoint "
                            "directory (acceptance is measured with the reference backend on local checkpoints)")
    if threads:
        torch.set_num_threads(threads)
    target, drafter = load_pair(tdir, ddir, torch.float32)
    positions = target.cfg.max_position_embeddings
    if prompt_len + max_new_tokens > positions:
        raise UserError(f"prompt length {prompt_len} + max new tokens {max_new_tokens} = {prompt_len + max_new_tokens} "
                        f"> the target's max_position_embeddings {positions} ({tdir / 'config.json'})")
    block = block_size or recipe.speculative.block_size
    ps = heldout_token_prompts(tdir, prompts, prompt_len)
    source = "held-out corpus windows"
    if ps is None:
        g = torch.Generator().manual_seed(0)
        ps = [torch.randint(0, target.cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
        source = "random token ids (the target has no tokenizer)"
    rounds = []
    for rec in generate_steps(target, drafter, ps, max_new_tokens, mode="dflash", block_size=block, stop_token_ids=[]):
        if rec.round == 0:
            continue
        for toks, done, drafted in zip(rec.tokens, rec.finished, rec.drafted):
            if done is None:
                rounds.append((len(toks) - 1, drafted))
    prof = AcceptanceProfile.from_rounds(
        rounds, block - 1, f"measured by the reference backend: {recipe.name}, {len(ps)} prompts x {prompt_len} "
        f"tokens ({source}), {max_new_tokens} greedy new tokens, block {block}", task="heldout")
    return AcceptanceProfile(prof.conditional, prof.source, prof.task, prof.reached, prof.accepted,
                             {"rounds": len(rounds), "prompts": len(ps), "prompt_len": prompt_len,
                              "max_new_tokens": max_new_tokens, "block_size": block})
