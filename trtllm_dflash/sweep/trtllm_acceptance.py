"""Per-request acceptance of a TensorRT-LLM (pytorch backend) deployment, read from the server.

trtllm-serve's streamed responses carry no acceptance until TensorRT-LLM PR #19311 (a per-choice
`speculative_decoding` object, which the load generator reads like ours: sweep/protocols.py). Two
server-side sources stand in, chosen by the deployed version (recipe/trtllm_api.py FIXES):

- "perf_metrics": the server's per-request metrics, GET /perf_metrics (TensorRT-LLM
  serve/openai_server.py `get_perf_metrics`): a list of {"request_id", "perf_metrics": {
  "first_iter", "last_iter", "timing_metrics", "kv_cache_metrics", "speculative_decoding":
  {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}}}, the last key only
  for requests that drafted; drained on every read, kept only with `return_perf_metrics` and
  `perf_metrics_max_requests` > 0 (deploy/llmapi.py writes both). The one-engine DFlash path
  fills speculative_decoding from PR #17082 on (1.3.0rc25, FIXES["per_request_acceptance"]);
  before it the counts read 0. Verify passes per request are not reported: taken as
  last_iter - first_iter (every iteration after the context one verifies the scheduled
  generation requests once) [I].
- "accept_stats": TensorRT-LLM's opt-in DFlash acceptance recorder
  (tensorrt_llm/_torch/speculative/accept_stats.py, TLLM_DFLASH_ACCEPT_STATS_DIR, flushed every
  TLLM_DFLASH_ACCEPT_STATS_FLUSH_EVERY verify steps): per rank, `dflash_accept_stats_rank{R}.json`
  = {"rank", "max_draft_len", "num_steps", "accepted_draft_hist", "per_request": {id: {"steps",
  "accepted_draft"}}, "confidence_calibration"}, cumulative since the server started. Tensor-
  parallel ranks record the same requests, so rank 0's file is read (upstream: "TP-replicated
  ranks should pass a single rank's file"). The recorder copies device to host every step:
  measurement runs, not performance references (upstream's caveat). deploy writes the variables
  into the launch lines of versions before PR #17082 (recipe/trtllm_api.py acceptance_source).

A level's requests are the server's, not paired with the client's: both sources name requests
by the executor's ids, which the responses do not carry.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError

ACCEPT_STATS_FILE = "dflash_accept_stats_rank0.json"
SOURCES = {"response": "the server's responses", "perf_metrics": "trtllm-serve's per-request metrics (/perf_metrics)",
           "accept_stats": "TensorRT-LLM's acceptance histograms (TLLM_DFLASH_ACCEPT_STATS_DIR)"}


@dataclass(frozen=True)
class ServerRequest:
    """One request as the server counted it."""

    steps: int  # verify passes
    accepted: int  # draft tokens accepted
    drafted: int | None = None  # draft tokens verified (None: the source does not say)

    @property
    def tau(self) -> float | None:
        """Tokens committed per verify pass, the bonus token counted."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else None


def from_perf_metrics(entries: list) -> list[ServerRequest]:
    """The requests of a /perf_metrics answer that report speculative decoding."""
    if not isinstance(entries, list):
        raise UserError(f"/perf_metrics: expected a JSON list, got {type(entries).__name__}")
    out = []
    for e in entries:
        metrics = (e or {}).get("perf_metrics") or {}
        spec = metrics.get("speculative_decoding")
        if not spec or metrics.get("first_iter") is None or metrics.get("last_iter") is None:
            continue
        out.append(ServerRequest(int(metrics["last_iter"]) - int(metrics["first_iter"]),
                                 int(spec["total_accepted_draft_tokens"]), int(spec["total_draft_tokens"])))
    return out


def read_accept_stats(stats_dir: Path) -> dict:
    """Rank 0's recorder snapshot in `stats_dir` ({} before its first flush)."""
    path = Path(stats_dir) / ACCEPT_STATS_FILE
    if not path.is_file():
        return {}
    try:
        snap = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a TensorRT-LLM acceptance-stats file ({e})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("per_request"), dict):
        raise UserError(f"{path}: no per_request table (expected accept_stats.py's snapshot)")
    return snap


def from_accept_stats(before: dict, after: dict) -> list[ServerRequest]:
    """The requests that ran verify passes between two snapshots (what grew of each)."""
    old = before.get("per_request", {})
    out = []
    for rid, v in after.get("per_request", {}).items():
        was = old.get(rid, {"steps": 0, "accepted_draft": 0})
        steps, accepted = int(v["steps"]) - int(was["steps"]), int(v["accepted_draft"]) - int(was["accepted_draft"])
        if steps > 0:
            out.append(ServerRequest(steps, accepted))
    return out


def fetch_perf_metrics(base_url: str, timeout: float = 30.0) -> list:
    """GET /perf_metrics of trtllm-serve at `base_url` (http://HOST:PORT); drains its queue."""
    try:
        with urllib.request.urlopen(f"{base_url}/perf_metrics", timeout=timeout) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise UserError(f"{base_url}/perf_metrics: cannot read the server's per-request metrics ({e})") from None


class ServerAcceptance:
    """Reads one level's requests from a TensorRT-LLM server: `start()` before the level,
    `level()` after it. `source`: "perf_metrics" (base_url) or "accept_stats" (stats_dir)."""

    def __init__(self, source: str, base_url: str | None = None, stats_dir: Path | None = None):
        self.source, self.base_url, self.stats_dir = source, base_url, stats_dir
        self._before: dict = {}

    def start(self) -> None:
        if self.source == "perf_metrics":
            fetch_perf_metrics(self.base_url)  # drains what earlier requests left
        else:
            self._before = read_accept_stats(self.stats_dir)

    def level(self) -> list[ServerRequest]:
        if self.source == "perf_metrics":
            return from_perf_metrics(fetch_perf_metrics(self.base_url))
        return from_accept_stats(self._before, read_accept_stats(self.stats_dir))


def with_server_requests(row, requests: list[ServerRequest], source: str):
    """A level row (sweep/metrics.py LevelSummary) whose requests did not report their own
    acceptance, with the per-request tau the server counted instead."""
    from dataclasses import replace

    from trtllm_dflash.sweep.metrics import Spread

    if row.acceptance_source is not None or not requests:
        return row
    return replace(row, tau_request=Spread.of([r.tau for r in requests]), acceptance_source=source)
