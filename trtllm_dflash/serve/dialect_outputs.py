"""Every output the TensorRT-LLM-on-Triton dialect models declare (deploy/dialect.py): when a
response carries it and what it is, and what a dialect request asks of the dflash model (its
outputs as deploy/settings.py declares them). serve/dialect.py to_dialect fills them;
docs/migrate-from-tensorrtllm-backend.md's output table is `describe_output`'s (tests/test_docs.py).
"""

from __future__ import annotations

from trtllm_dflash.deploy.settings import DFLASH_OUTPUTS as _DFLASH

# What a dialect request asks of the dflash model: its outputs as deploy declares them
# (serve/dialect.py Forward.dflash_outputs); its [1] ones but those to_dialect maps itself are sent as they are
# (batch-first).
DFLASH_OUTPUTS = tuple(t.name for t in _DFLASH)
_REMAPPED = ("text_output", "output_ids", "output_log_probs", "cum_log_probs")
STATS = tuple(t.name for t in _DFLASH if t.dims == (1,) and t.name not in _REMAPPED)
# Every output the dialect models declare (deploy/dialect.py): when a response carries it
# (serve/dialect.py `_outputs`: "always", the kind's own "text" / "ids", the return_* flag of the request that
# adds it, or "never") and what it is. docs/migrate-from-tensorrtllm-backend.md's output table is
# this table (tests/test_docs.py).
_UPSTREAM_FIRST = {
    "text_output": ("text", "the text of this response: streamed, the new text only; not streamed, all of it "
                            "(after the prompt unless `exclude_input_in_output`)"),
    "output_ids": ("ids", "`[1, 1, n]`: streamed, the new tokens; not streamed, prompt (unless excluded) and output"),
    "sequence_length": ("ids", "`[1, 1]`: the number of tokens in `output_ids`"),
    "total_draft_tokens": ("always", "the request's draft tokens verified so far (upstream: with return_perf_metrics)"),
    "total_accepted_draft_tokens": ("always", "the request's draft tokens accepted so far (upstream: with "
                                              "return_perf_metrics)"),
    "acceptance_rate": ("return_perf_metrics", "accepted / drafted draft tokens so far"),
    "acceptance_histogram": ("return_perf_metrics", "ours: `[1, n]` verify passes by the drafts each accepted "
                                                    "(entry j: passes that accepted exactly j)"),
    **dict.fromkeys(("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"),
                    ("return_perf_metrics", "wall clock at the model")),
    "num_output_tokens": ("return_num_output_tokens", "tokens generated so far"),
    "num_input_tokens": ("return_num_input_tokens", "prompt tokens (tensorrt_llm; the text models refuse the flag)"),
}
_UPSTREAM_LAST = {
    "output_log_probs": ("return_log_probs", "`[1, 1, n]`: each of this response's tokens' log-probability under "
                                             "the target"),
    "cum_log_probs": ("return_log_probs", "`[1, 1]`: their sum over the whole output so far"),
    **dict.fromkeys(("context_logits", "generation_logits"), ("never", "the inputs that ask for them are refused")),
    "batch_index": ("batch", "which prompt of a request of several this response answers"),
    "sequence_index": ("never", "one sequence per prompt: index 0, what clients assume when it is absent"),
    **dict.fromkeys(("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                     "first_scheduled_time_ns"), ("never", "the dflash engine does not report them")),
    "context_phase_params": ("never", "no disaggregated serving"),
}
# dflash's own statistics, sent on every response, described where deploy declares them
_OURS = {t.name: ("always", f"ours: {t.doc}") for t in _DFLASH if t.name in STATS and t.name not in _UPSTREAM_FIRST}
OUTPUTS_AS = {**_UPSTREAM_FIRST, **_OURS, **_UPSTREAM_LAST}
PERF = tuple(n for n, (sent, _) in OUTPUTS_AS.items() if sent == "return_perf_metrics")
LOG_PROBS = tuple(n for n, (sent, _) in OUTPUTS_AS.items() if sent == "return_log_probs")


def describe_output(name: str) -> str:
    """When a dialect model sends output `name`, and what it is, in a phrase."""
    sent, what = OUTPUTS_AS[name]
    when = {"always": "every response", "text": "every response", "ids": "every response",
            "batch": "every response to a request of several prompts",
            "never": "never sent"}.get(sent, f"with `{sent}`")
    return f"{when}: {what}"
