"""Per-request acceptance of a TensorRT-LLM deployment (sweep/trtllm_acceptance.py), on CPU, from
records in upstream's formats: trtllm-serve's GET /perf_metrics answer (serve/openai_server.py
`get_perf_metrics`) and the DFlash acceptance recorder's rank file
(tensorrt_llm/_torch/speculative/accept_stats.py `DFlashAcceptStatsRecorder.snapshot`)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.sweep.metrics import LevelSummary, RequestRecord, summarize_level
from trtllm_dflash.sweep.trtllm_acceptance import (
    ACCEPT_STATS_FILE,
    ServerAcceptance,
    ServerRequest,
    from_accept_stats,
    from_perf_metrics,
    read_accept_stats,
    with_server_requests,
)

QWEN = "recipes/hopper/h200-qwen3-coder-30b-a3b-fp8.yaml"


def perf_entry(request_id, first_iter, last_iter, accepted=None, drafted=None):
    """One entry of trtllm-serve's /perf_metrics list, as get_perf_metrics serializes it (the
    speculative_decoding key only when the request drafted)."""
    metrics = {"first_iter": first_iter, "last_iter": last_iter,
               "timing_metrics": {"server_arrival_time": 1.0, "arrival_time": 1.0, "first_scheduled_time": 1.1,
                                  "first_token_time": 1.2, "server_first_token_time": 1.2, "last_token_time": 2.0},
               "kv_cache_metrics": {"num_total_allocated_blocks": 4, "num_new_allocated_blocks": 4,
                                    "num_reused_blocks": 0, "num_missed_blocks": 4}}
    if drafted:
        metrics["speculative_decoding"] = {"acceptance_rate": accepted / drafted,
                                           "total_accepted_draft_tokens": accepted, "total_draft_tokens": drafted}
    return {"request_id": request_id, "perf_metrics": metrics, "server_arrival_time": None}


def snapshot(per_request: dict, max_draft_len=7) -> dict:
    """A recorder rank file: DFlashAcceptStatsRecorder.snapshot() of rank 0."""
    hist = [0] * (max_draft_len + 1)
    return {"rank": 0, "max_draft_len": max_draft_len, "num_steps": sum(s for s, _ in per_request.values()),
            "accepted_draft_hist": hist,
            "per_request": {str(r): {"steps": s, "accepted_draft": a} for r, (s, a) in per_request.items()},
            "confidence_calibration": {"num_bins": 20, "attempts": [[0] * 20] * max_draft_len,
                                       "accepted": [[0] * 20] * max_draft_len}}


def test_perf_metrics_give_each_drafting_requests_passes_and_acceptance():
    entries = [perf_entry(11, 3, 13, accepted=25, drafted=70), perf_entry(12, 4, 24, accepted=10, drafted=140),
               perf_entry(13, 5, 9)]  # no speculative_decoding: it drafted nothing
    reqs = from_perf_metrics(json.loads(json.dumps(entries)))
    assert reqs == [ServerRequest(10, 25, 70), ServerRequest(20, 10, 140)]
    assert [r.tau for r in reqs] == pytest.approx([3.5, 1.5])
    with pytest.raises(UserError, match="/perf_metrics: expected a JSON list"):
        from_perf_metrics({"error": "x"})


def test_accept_stats_give_what_each_request_did_between_two_snapshots(tmp_path):
    assert read_accept_stats(tmp_path) == {}  # before the recorder's first flush
    before = snapshot({1: (4, 6), 2: (10, 3)})
    after = snapshot({1: (4, 6), 2: (14, 11), 3: (5, 20)})  # 1 finished before; 2 grew; 3 is new
    (tmp_path / ACCEPT_STATS_FILE).write_text(json.dumps(after))
    (tmp_path / "dflash_accept_stats_rank1.json").write_text(json.dumps(snapshot({9: (1, 1)})))  # a tp replica
    assert read_accept_stats(tmp_path) == after
    reqs = from_accept_stats(before, read_accept_stats(tmp_path))
    assert sorted(reqs, key=lambda r: r.steps) == [ServerRequest(4, 8), ServerRequest(5, 20)]
    (tmp_path / ACCEPT_STATS_FILE).write_text("{not json")
    with pytest.raises(UserError, match=f"{ACCEPT_STATS_FILE}: not a TensorRT-LLM acceptance-stats file"):
        read_accept_stats(tmp_path)


def test_server_acceptance_reads_a_level_from_either_source(tmp_path):
    # /perf_metrics is drained on read: start() discards what came before the level.
    answers = [[perf_entry(1, 0, 5, 4, 35)], [perf_entry(2, 1, 5, 8, 28), perf_entry(3, 1, 3, 0, 14)]]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            assert self.path == "/perf_metrics"
            body = json.dumps(answers.pop(0)).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = ServerAcceptance("perf_metrics", base_url=f"http://127.0.0.1:{httpd.server_port}")
        server.start()
        assert server.level() == [ServerRequest(4, 8, 28), ServerRequest(2, 0, 14)] and not answers
    finally:
        httpd.shutdown()
    (tmp_path / ACCEPT_STATS_FILE).write_text(json.dumps(snapshot({1: (3, 3)})))
    server = ServerAcceptance("accept_stats", stats_dir=tmp_path)
    server.start()
    (tmp_path / ACCEPT_STATS_FILE).write_text(json.dumps(snapshot({1: (3, 3), 2: (4, 4)})))
    assert server.level() == [ServerRequest(4, 4)]
    with pytest.raises(UserError, match="cannot read the server's per-request metrics"):
        ServerAcceptance("perf_metrics", base_url="http://127.0.0.1:9").start()


def test_a_level_without_acceptance_in_its_responses_takes_the_servers():
    recs = [RequestRecord(i, 1, 0, [10, 20], [1, 5], end_ns=20, rounds=0) for i in range(3)]  # plain OpenAI stream
    row = summarize_level(recs, 1, 1)
    assert row.tau_request is None and row.acceptance_source is None
    got = with_server_requests(row, [ServerRequest(4, 4), ServerRequest(4, 8), ServerRequest(2, 8)], "accept_stats")
    assert got.acceptance_source == "accept_stats" and got.tau_request.n == 3
    assert (got.tau_request.p10, got.tau_request.p50, got.tau_request.p90) == pytest.approx((2.2, 3.0, 4.6))
    assert LevelSummary.from_json(json.loads(json.dumps(got.__dict__, default=lambda o: o.__dict__))) == got
    # responses that carried their own acceptance keep it
    own = summarize_level([RequestRecord(0, 1, 0, [10], [3], end_ns=10, rounds=1, accepted=1,
                                         acceptance_source="response")], 1, 1)
    assert with_server_requests(own, [ServerRequest(1, 0)], "perf_metrics") is own


@pytest.mark.parametrize("version,source", [("1.3.0rc27", "perf_metrics"), ("1.3.0rc24", "accept_stats")])
def test_the_version_picks_the_source_and_deploy_writes_what_it_needs(tmp_path, version, source):
    """1.3.0rc25 on (PR #17082) fills DFlash's per-request metrics: trtllm-serve keeps them for
    /perf_metrics; before it the launch lines switch TensorRT-LLM's acceptance recorder on."""
    from trtllm_dflash.deploy.llmapi import extra_llm_api_options, trtllm_serve_commands
    from trtllm_dflash.sweep.stage import server_acceptance

    recipe = load_recipe(QWEN, [f"backend.trtllm_version={version}"])
    deploy_dir = tmp_path / "deploy"
    server = server_acceptance(recipe, "127.0.0.1:8000", "openai", deploy_dir)
    assert server.source == source
    options = extra_llm_api_options(recipe, tmp_path / "quantize")
    commands = trtllm_serve_commands(recipe, tmp_path / "quantize", deploy_dir / "trtllm_serve" / "options.yaml")
    stats_dir = deploy_dir / "trtllm_serve" / "accept_stats"
    env = ["env", f"TLLM_DFLASH_ACCEPT_STATS_DIR={stats_dir}", "TLLM_DFLASH_ACCEPT_STATS_FLUSH_EVERY=1"]
    if source == "perf_metrics":
        assert server.base_url == "http://127.0.0.1:8000" and options["perf_metrics_max_requests"] > 0
        assert all("env" not in cmd for cmd in commands.values())
    else:
        assert server.stats_dir == stats_dir and "perf_metrics_max_requests" not in options
        assert commands["single_node"][:3] == env
        for name in ("mpirun", "srun"):  # every rank's environment: before the per-rank launcher
            cmd = commands[name]
            assert cmd[cmd.index("trtllm-llmapi-launch") - 3:cmd.index("trtllm-llmapi-launch")] == env
    assert server_acceptance(recipe, "127.0.0.1:8000", "grpc", deploy_dir) is None  # Triton: the responses say
