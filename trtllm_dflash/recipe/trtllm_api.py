"""What each TensorRT-LLM release of the pytorch backend accepts and fixes: the first release that
has each LLM-API field or value a deployment may write, and the upstream fixes a deployment leans
on. `check` refuses a recipe whose `backend.trtllm_version` lacks a field it needs; deploy
(deploy/llmapi.py) writes only what the version has; `doctor` and the sweep read the fixes.

A pull request's first release is the first version bump on NVIDIA/TensorRT-LLM main after it
merged (one merged on a bump day counts for the next); the bumps and merge dates behind each
entry are in docs/design/upstream-facts.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Since:
    version: str  # the first TensorRT-LLM release that has it
    pr: str  # the upstream pull request
    what: str


# LLM-API fields and values, named as written (`speculative_config` is a DFlashDecodingConfig).
FIELDS: dict[str, Since] = {
    # 1.3.0rc20 is the oldest release whose DFlash we read (PR #15666 ran Laguna drafters on it).
    "speculative_config.decoding_type=DFlash": Since("1.3.0rc20", "#12794", "DFlash in the PyTorch backend"),
    "speculative_config.attention_backend": Since("1.3.0rc24", "#16914", "the drafter's attention backend field"),
    # FA4 selectable on SM90; in the 1.3.0rc27 API reference.
    "speculative_config.attention_backend=FA4": Since("1.3.0rc27", "#18553", "FA4 drafter attention"),
    "speculative_config.context_recompute_tail": Since("1.4.0rc1", "1.4.0rc1 API reference",
                                                       "prompt tokens recomputed after a prefix-cache hit"),
    "trtllm-serve --config": Since("1.2.0rc1", "#9104", "trtllm-serve's --config option"),
    # Per-request metrics as JSONL files under the directory (the records GET /perf_metrics used to
    # answer, which #16668 removed); merged on the 1.3.0rc24 bump day, so first in 1.3.0rc25.
    "perf_metrics_output_dir": Since("1.3.0rc25", "#16668", "per-request metrics written as JSONL files"),
    # A per-choice `speculative_decoding` object on OpenAI responses, server opt-in; merged after
    # the 1.4.0rc0 bump. LlmArgs is strict: an older release refuses to start with the key.
    "per_request_spec_decode_stats": Since("1.4.0rc1", "#19311", "per-request acceptance on each response choice"),
}

# Upstream fixes a deployment relies on.
FIXES: dict[str, Since] = {
    # One-engine speculative decoding fills request_perf_metrics.speculative_decoding; before it
    # DFlash's per-request acceptance reads 0.
    "per_request_acceptance": Since("1.3.0rc25", "#17082", "per-request DFlash acceptance in the perf metrics"),
    # max_draft_len + 1 > the drafter's block_size raises.
    "block_size_guard": Since("1.3.0rc26", "#17935", "max_draft_len + 1 <= block_size enforced"),
}

# TensorRT-LLM's opt-in DFlash acceptance recorder (tensorrt_llm/_torch/speculative/accept_stats.py,
# from PR #17327, whose review ran in early August 2026: about the release of #17082 [I]): set, it
# writes per-rank acceptance histograms and per-request totals under the directory named.
ACCEPT_STATS_ENV = "TLLM_DFLASH_ACCEPT_STATS_DIR"
ACCEPT_STATS_FLUSH_ENV = "TLLM_DFLASH_ACCEPT_STATS_FLUSH_EVERY"  # verify steps between writes (default 50)


def acceptance_source(version: str) -> str:
    """Where a sweep reads a deployment's per-request acceptance, from the version's own surface:
    - "speculative_decoding": each response choice's object (PR #19311; deploy opts in);
    - "perf_metrics_jsonl": the per-request metrics JSONL under perf_metrics_output_dir (PR #16668,
      the same release as PR #17082, which filled DFlash's counts);
    - "accept_stats": TensorRT-LLM's acceptance recorder files before those (deploy switches it on).
    GET /perf_metrics is no source: the release that filled DFlash's counts there (#17082) is the
    one that removed the route (#16668)."""
    if has(version, "per_request_spec_decode_stats"):
        return "speculative_decoding"
    if has(version, "perf_metrics_output_dir") and has(version, "per_request_acceptance", FIXES):
        return "perf_metrics_jsonl"
    return "accept_stats"


# TensorRT-LLM releases of the pytorch backend's lines, as main's version bumps made them (the
# 1.3 line ended in release candidates: main went from 1.3.0rc30 to 1.4.0rc0 the same day;
# docs/design/upstream-facts.md); 1.4.0rc4 is the newest whose API reference was read.
RELEASES = tuple(f"1.3.0rc{n}" for n in range(20, 31)) + tuple(f"1.4.0rc{n}" for n in range(0, 5))

# What the shipped pytorch recipes pin: the release NVIDIA Dynamo 1.6.1 pins (its tensorrtllm-runtime
# image carries it; recipe/catalog/images.yaml), carrying every fix above. Its DFlashDecodingConfig
# is taken to be 1.3.0rc27's, the newest 1.3 API reference (deploy/llmapi.py DFLASH_FIELDS).
PINNED = "1.3.0rc29"


def release_problem(version: str) -> tuple[str, str] | None:
    """("error" | "warning", why) for a version that is no known release, None for a known one."""
    v = parse(version)
    if v is None or version in RELEASES:
        return None
    newest = max(RELEASES, key=Version)
    if v > Version(newest):
        return "warning", (f"{version} is newer than the releases this table knows (up to {newest}): the fields "
                           "it writes are checked against the newest known")
    line = [r for r in RELEASES if r.startswith(f"{v.major}.{v.minor}.")]
    known = f"{line[0]}-{line[-1]}" if line else "none"
    return "error", f"no TensorRT-LLM release {version} exists (the {v.major}.{v.minor} line's releases: {known})"


def parse(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def has(version: str, name: str, table: dict[str, Since] = FIELDS) -> bool:
    """Whether TensorRT-LLM `version` has `name` (a FIELDS or FIXES key)."""
    v, since = parse(version), parse(table[name].version)
    return v is not None and v >= since


def missing(version: str, names: list[str]) -> list[str]:
    """The FIELDS among `names` that `version` lacks, in order."""
    return [n for n in names if not has(version, n)]


def needs_message(version: str, name: str) -> str:
    s = FIELDS[name]
    return f"{version} has no {name} ({s.what}): it needs TensorRT-LLM >= {s.version} (PR {s.pr})"


def drafter_attention(asked: str, blackwell: bool) -> str:
    """The drafter's attention backend: what the recipe asks for, else TRTLLM on Blackwell (the
    FlashInfer trtllm-gen kernels, SM100 / SM103) and VANILLA elsewhere. FA4 only when asked: it
    imports the flash-attn-4 CuTe package, which TensorRT-LLM's requirements do not list."""
    if asked != "auto":
        return asked
    return "TRTLLM" if blackwell else "VANILLA"


def fields_needed(attention: str, recompute_tail: bool) -> list[str]:
    """The FIELDS a pytorch deployment writes (VANILLA is the default and is not written)."""
    out = ["speculative_config.decoding_type=DFlash"]
    if attention != "VANILLA":
        out.append("speculative_config.attention_backend")
    if attention == "FA4":
        out.append("speculative_config.attention_backend=FA4")
    if recompute_tail:
        out.append("speculative_config.context_recompute_tail")
    return out
