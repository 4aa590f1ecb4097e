"""Per-request acceptance of a TensorRT-LLM deployment (sweep/trtllm_acceptance.py), on CPU, from
records in upstream's formats: trtllm-serve's per-request metrics JSONL in both record shapes
(tensorrt_llm/serve/_perf_metrics_schema.py WorkerPerfMetricsRecord @4856bb73; perf_metrics.py
build_request_metrics_record @67f52074) and the DFlash acceptance recorder's rank file
(tensorrt_llm/_torch/speculative/accept_stats.py `DFlashAcceptStatsRecorder.snapshot`). PR #19311's
per-choice object is read from the responses (tests/sweep/test_loadgen_openai.py)."""

import json

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


def perf_entry(request_id, first_iter, last_iter, accepted=None, drafted=None, phases=False):
    """One per-request metrics record (the speculative_decoding key only when the request drafted):
    WorkerPerfMetricsRecord, or with `phases` the schema_version 1 record."""
    metrics = {"first_iter": first_iter, "last_iter": last_iter,
               "timing_metrics": {"server_arrival_time": 1.0, "arrival_time": 1.0, "first_scheduled_time": 1.1,
                                  "first_token_time": 1.2, "server_first_token_time": 1.2, "last_token_time": 2.0},
               "kv_cache_metrics": {"num_total_allocated_blocks": 4, "num_new_allocated_blocks": 4,
                                    "num_reused_blocks": 0, "num_missed_blocks": 4}}
    if drafted:
        metrics["speculative_decoding"] = {"acceptance_rate": accepted / drafted,
                                           "total_accepted_draft_tokens": accepted, "total_draft_tokens": drafted}
    if phases:
        return {"schema_version": 1, "request_id": str(request_id), "status": "complete", "phases": {"server": metrics}}
    return {"request_id": request_id, "perf_metrics": metrics, "status": "complete"}


def snapshot(per_request: dict, max_draft_len=7) -> dict:
    """A recorder rank file: DFlashAcceptStatsRecorder.snapshot() of rank 0."""
    hist = [0] * (max_draft_len + 1)
    return {"rank": 0, "max_draft_len": max_draft_len, "num_steps": sum(s for s, _ in per_request.values()),
            "accepted_draft_hist": hist,
            "per_request": {str(r): {"steps": s, "accepted_draft": a} for r, (s, a) in per_request.items()},
            "confidence_calibration": {"num_bins": 20, "attempts": [[0] * 20] * max_draft_len,
                                       "accepted": [[0] * 20] * max_draft_len}}


@pytest.mark.parametrize("phases", [False, True], ids=["worker-record", "schema-v1"])
def test_perf_metrics_give_each_drafting_requests_passes_and_acceptance(phases):
    entries = [perf_entry(11, 3, 13, 25, 70, phases), perf_entry(12, 4, 24, 10, 140, phases),
               perf_entry(13, 5, 9, phases=phases)]  # no speculative_decoding: it drafted nothing
    reqs = from_perf_metrics(json.loads(json.dumps(entries)))
    assert reqs == [ServerRequest(10, 25, 70), ServerRequest(20, 10, 140)]
    assert [r.tau for r in reqs] == pytest.approx([3.5, 1.5])


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
    # trtllm-serve appends to one JSONL per server process; a level is what was appended during it
    jsonl = tmp_path / "perf_metrics"
    jsonl.mkdir()
    f = jsonl / "perf_metrics-server-host-123-20261201T000000Z.jsonl"
    f.write_text(json.dumps(perf_entry(1, 0, 5, 4, 35)) + "\n")
    server = ServerAcceptance("perf_metrics_jsonl", jsonl)
    server.start()
    with f.open("a") as out:
        out.write(json.dumps(perf_entry(2, 1, 5, 8, 28)) + "\n" + json.dumps(perf_entry(3, 1, 3, 0, 14, True)) + "\n")
        out.write('{"request_id": "4", "perf')  # still being written: left for the next read
    second = jsonl / "perf_metrics-server-host-124-20261201T000001Z.jsonl"
    second.write_text(json.dumps(perf_entry(5, 0, 2, 2, 7)) + "\n")
    assert server.level() == [ServerRequest(4, 8, 28), ServerRequest(2, 0, 14), ServerRequest(2, 2, 7)]
    f.write_text("not json\n")
    with pytest.raises(UserError, match="record 1 after the level's start is not JSON"):
        ServerAcceptance("perf_metrics_jsonl", jsonl).level()
    (tmp_path / ACCEPT_STATS_FILE).write_text(json.dumps(snapshot({1: (3, 3)})))
    server = ServerAcceptance("accept_stats", tmp_path)
    server.start()
    (tmp_path / ACCEPT_STATS_FILE).write_text(json.dumps(snapshot({1: (3, 3), 2: (4, 4)})))
    assert server.level() == [ServerRequest(4, 4)]
    with pytest.raises(ValueError, match="the server's responses carry it"):
        ServerAcceptance("speculative_decoding", tmp_path)


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
    assert with_server_requests(own, [ServerRequest(1, 0)], "perf_metrics_jsonl") is own


@pytest.mark.parametrize("version,source", [("1.4.0rc1", "speculative_decoding"), ("1.3.0rc29", "perf_metrics_jsonl"),
                                            ("1.3.0rc24", "accept_stats")])
def test_the_version_picks_the_source_and_deploy_writes_what_it_needs(tmp_path, version, source):
    """Each release's own surface: PR #19311's per-choice object (1.4.0rc1 on: the strict opt-in
    key written only there), the metrics JSONL (PR #16668, 1.3.0rc25 on, with PR #17082's DFlash
    counts), the acceptance recorder's files before them. GET /perf_metrics and the deprecated
    perf_metrics_max_requests are never written."""
    from trtllm_dflash.deploy.llmapi import extra_llm_api_options, trtllm_serve_commands
    from trtllm_dflash.recipe.trtllm_api import acceptance_source
    from trtllm_dflash.sweep.stage import server_acceptance

    assert acceptance_source(version) == source
    recipe = load_recipe(QWEN, [f"backend.trtllm_version={version}"])
    deploy_dir = tmp_path / "deploy"
    serve_dir = deploy_dir / "trtllm_serve"
    server = server_acceptance(recipe, "127.0.0.1:8000", "openai", deploy_dir)
    options = extra_llm_api_options(recipe, tmp_path / "quantize", serve_dir)
    commands = trtllm_serve_commands(recipe, tmp_path / "quantize", serve_dir / "options.yaml")
    env = ["env", f"TLLM_DFLASH_ACCEPT_STATS_DIR={serve_dir / 'accept_stats'}",
           "TLLM_DFLASH_ACCEPT_STATS_FLUSH_EVERY=1"]
    assert "perf_metrics_max_requests" not in options
    assert options.get("per_request_spec_decode_stats") is (True if source == "speculative_decoding" else None)
    assert ("perf_metrics_output_dir" in options) is (source != "accept_stats")
    if source == "speculative_decoding":
        assert server is None  # the responses carry it: the load generator reads them
    elif source == "perf_metrics_jsonl":
        assert server.directory == serve_dir / "perf_metrics" == tmp_path / "deploy" / "trtllm_serve" / "perf_metrics"
        assert options["perf_metrics_output_dir"] == str((serve_dir / "perf_metrics").resolve())
    else:
        assert server.directory == serve_dir / "accept_stats"
    if source == "accept_stats":
        assert commands["single_node"][:3] == env
        for name in ("mpirun", "srun"):  # every rank's environment: before the per-rank launcher
            cmd = commands[name]
            assert cmd[cmd.index("trtllm-llmapi-launch") - 3:cmd.index("trtllm-llmapi-launch")] == env
    else:
        assert all("env" not in cmd for cmd in commands.values())
    assert server_acceptance(recipe, "127.0.0.1:8000", "grpc", deploy_dir) is None  # Triton: the responses say
