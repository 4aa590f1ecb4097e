"""Per-request acceptance of a TensorRT-LLM (pytorch backend) deployment, read from the server.

Each release's own surface, chosen by the deployed version (recipe/trtllm_api.py acceptance_source):

- "speculative_decoding" (PR #19311, 1.4.0rc1 on): every response choice carries a
  `speculative_decoding` object in our own OpenAI server's shape, which the load generator reads
  from the responses (sweep/protocols.py): nothing is read here.
- "perf_metrics_jsonl" (PR #16668, 1.3.0rc25 on): trtllm-serve appends one JSON record per finished
  request to `perf_metrics-<server kind>-<host>-<pid>-<time>.jsonl` under perf_metrics_output_dir
  (tensorrt_llm/serve/perf_metrics.py; deploy writes the directory). Two record shapes are read:
  the first one, `{"request_id", "perf_metrics": {"first_iter", "last_iter", ..., "speculative_decoding":
  {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}}, "status"}`
  (tensorrt_llm/serve/_perf_metrics_schema.py WorkerPerfMetricsRecord @4856bb73, the records GET
  /perf_metrics answered before), and the later `{"schema_version": 1, "request_id", "status",
  "phases": {"server": {the same fields}}}` (perf_metrics.py build_request_metrics_record @67f52074).
  speculative_decoding is there only for requests that drafted. Verify passes per request are not
  reported: taken as last_iter - first_iter (every iteration after the context one verifies the
  scheduled generation requests once) [I].
- "accept_stats" (before those): TensorRT-LLM's opt-in DFlash acceptance recorder
  (tensorrt_llm/_torch/speculative/accept_stats.py, TLLM_DFLASH_ACCEPT_STATS_DIR, flushed every
  TLLM_DFLASH_ACCEPT_STATS_FLUSH_EVERY verify steps): per rank, `dflash_accept_stats_rank{R}.json`
  = {"rank", "max_draft_len", "num_steps", "accepted_draft_hist", "per_request": {id: {"steps",
  "accepted_draft"}}, "confidence_calibration"}, cumulative since the server started. Tensor-
  parallel ranks record the same requests, so rank 0's file is read (upstream: "TP-replicated
  ranks should pass a single rank's file"). The recorder copies device to host every step:
  measurement runs, not performance references (upstream's caveat). deploy writes the variables
  into the launch lines of those versions.

A level's requests are the server's, not paired with the client's: the server names requests
by the executor's ids, which the responses do not carry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError

ACCEPT_STATS_FILE = "dflash_accept_stats_rank0.json"
SOURCES = {"response": "the server's responses",
           "nvext.engine_data": "the responses' nvext.engine_data (Dynamo's frontend)",
           "perf_metrics_jsonl": "trtllm-serve's per-request metrics JSONL (perf_metrics_output_dir)",
           "accept_stats": "TensorRT-LLM's acceptance histograms (TLLM_DFLASH_ACCEPT_STATS_DIR)"}
JSONL_GLOB = "perf_metrics-*.jsonl"


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


def from_perf_metrics(records: list) -> list[ServerRequest]:
    """The requests among per-request metrics records (either shape) that report speculative decoding."""
    out = []
    for r in records:
        if not isinstance(r, dict):
            continue
        phases = r.get("phases")
        first_phase = next(iter(phases.values()), {}) if isinstance(phases, dict) and phases else None
        metrics = first_phase if first_phase is not None else r.get("perf_metrics") or {}
        spec = metrics.get("speculative_decoding")
        if not spec or metrics.get("first_iter") is None or metrics.get("last_iter") is None:
            continue
        out.append(ServerRequest(int(metrics["last_iter"]) - int(metrics["first_iter"]),
                                 int(spec["total_accepted_draft_tokens"]), int(spec["total_draft_tokens"])))
    return out


def jsonl_offsets(directory: Path) -> dict[Path, int]:
    """Where each metrics file of `directory` ends now ({} before the server wrote any)."""
    return {f: f.stat().st_size for f in sorted(Path(directory).glob(JSONL_GLOB))}


def read_jsonl_since(directory: Path, offsets: dict[Path, int]) -> list:
    """The records appended to the metrics files of `directory` after `offsets` (a partly written
    last line is left for the next read)."""
    records = []
    for f in sorted(Path(directory).glob(JSONL_GLOB)):
        with f.open("rb") as fh:
            fh.seek(offsets.get(f, 0))
            data = fh.read()
        for n, line in enumerate(data.split(b"\n")[:-1], 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as e:
                    raise UserError(f"{f}: record {n} after the level's start is not JSON ({e})") from None
    return records


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


class ServerAcceptance:
    """Reads one level's requests from a TensorRT-LLM server's files in `directory`: `start()`
    before the level, `level()` after it. `source`: "perf_metrics_jsonl" or "accept_stats"."""

    def __init__(self, source: str, directory: Path):
        if source not in ("perf_metrics_jsonl", "accept_stats"):
            raise ValueError(f"source {source!r}: the server's responses carry it; nothing to read from its files")
        self.source, self.directory = source, Path(directory)
        self._before: dict = {}

    def start(self) -> None:
        self._before = (jsonl_offsets(self.directory) if self.source == "perf_metrics_jsonl"
                        else read_accept_stats(self.directory))

    def level(self) -> list[ServerRequest]:
        if self.source == "perf_metrics_jsonl":
            return from_perf_metrics(read_jsonl_since(self.directory, self._before))
        return from_accept_stats(self._before, read_accept_stats(self.directory))


def with_server_requests(row, requests: list[ServerRequest], source: str):
    """A level row (sweep/metrics.py LevelSummary) whose requests did not report their own
    acceptance, with the per-request tau the server counted instead."""
    from dataclasses import replace

    from trtllm_dflash.sweep.metrics import Spread

    if row.acceptance_source is not None or not requests:
        return row
    return replace(row, tau_request=Spread.of([r.tau for r in requests]), acceptance_source=source)
