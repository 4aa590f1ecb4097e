"""The `dflash` Triton model's renderer: an Update (serve/record.py) as the response tensors
deploy declares (deploy/settings.py DFLASH_OUTPUTS, with their dtypes), pure numpy.

`VALUES` says which value of the record each output is; `output_names` which outputs a request's
responses carry: those it named, else the defaults, plus the per-request acceptance with
tensorrtllm_backend's return_perf_metrics; log-probs only with return_log_probs. The dialect
models (serve/dialect.py) forward these tensors in tensorrtllm_backend's shapes.
"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from trtllm_dflash.deploy.settings import DFLASH_OUTPUTS

VALUES = {  # output -> its value in an Update
    "text_output": lambda u: u.text.encode("utf-8"),
    "output_token_count": lambda u: u.tokens,
    "total_output_tokens": lambda u: u.total_tokens,
    "rounds": lambda u: u.spec.rounds,
    "total_draft_tokens": lambda u: u.spec.drafted,
    "total_accepted_draft_tokens": lambda u: u.spec.accepted,
    "acceptance_length": lambda u: u.acceptance_length,
    "finish_reason": lambda u: (u.finish_reason or "").encode(),
    "avg_decoded_tokens_per_iter": lambda u: u.avg_decoded_tokens_per_iter,
    "output_ids": lambda u: u.ids,
    "acceptance_rate": lambda u: u.spec.acceptance_rate,
    "acceptance_histogram": lambda u: u.spec.histogram,
    "output_log_probs": lambda u: u.logprobs or (),
    "cum_log_probs": lambda u: u.cum_logprob,
}
_NUMPY = {mc.TYPE_STRING: object, mc.TYPE_INT32: np.int32, mc.TYPE_FP32: np.float32}
DTYPES = {t.name: _NUMPY[t.dtype] for t in DFLASH_OUTPUTS}  # what deploy declared, as numpy dtypes
OUTPUTS = tuple(DTYPES)

PERF_OUTPUTS = ("acceptance_rate", "acceptance_histogram")  # sent with return_perf_metrics (or when named)
LOG_PROBS = ("output_log_probs", "cum_log_probs")  # sent with return_log_probs only
ON_REQUEST = ("output_ids", *LOG_PROBS, *PERF_OUTPUTS)  # output_ids: to a client that names it (tensorrt_llm)
DEFAULT_OUTPUTS = tuple(n for n in OUTPUTS if n not in ON_REQUEST)


def output_names(requested: list[str], perf_metrics: bool, log_probs: bool) -> list[str]:
    """What a request's responses carry: the outputs it named, and no other; a request naming none
    (Triton names every declared one for it) gets the defaults, with tensorrtllm_backend's
    `return_perf_metrics` the per-request acceptance too. Log-probs go only to a request with
    return_log_probs.

    Never more than it named: Triton hands the client only what it named, and the Python stub of
    the tritonserver nvidia-pytriton 0.7.0 bundles (python_backend r24.10) drops the rest with the
    GIL released (response_sender.cc Send, PruneOutputTensors), a data race that can kill the stub
    (fixed by triton-inference-server/python_backend PR #390, r25.01). The sweep names its outputs
    and sets return_perf_metrics, so every response used to carry an acceptance_rate to drop."""
    names = [n for n in requested if n in DTYPES]
    if not names:
        names = list(DEFAULT_OUTPUTS)
        if perf_metrics:
            names += [n for n in PERF_OUTPUTS if n not in names]
    return [n for n in names if log_probs or n not in LOG_PROBS]


def tensors(update, names) -> dict[str, np.ndarray]:
    """The outputs `names` of one update, 1-D as config.pbtxt declares them."""
    return {n: np.array(VALUES[n](update), dtype=DTYPES[n]).reshape(-1) for n in names}
