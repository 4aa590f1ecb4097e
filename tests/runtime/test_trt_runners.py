"""runtime/trt_runners.py on CPU, against a stand-in of TensorRT-LLM 1.2.1's executor bindings
(tests/helpers/fake_bindings.py: keyword-only Request arguments, "context_"/"generation_" output
names, reused rows left unwritten): the Executor configuration, the adapter EngineTarget drives,
and a whole greedy decode through TrtExecutor + ArenaDrafter equal to the CPU engine runners.
(That this module imports here at all shows it imports no tensorrt / tensorrt_llm at import time.)"""

import json
from pathlib import Path

import pytest

import fake_bindings
import fake_cuda
from reference_helpers import make_drafter, make_target
from trtllm_dflash.errors import UserError
from trtllm_dflash.reference import SamplingParams, load_pair
from trtllm_dflash.runtime import trt_runners
from trtllm_dflash.runtime.drafter_runner import ArenaDrafter, TorchDrafterSession
from trtllm_dflash.runtime.engine_runners import EngineModel, EngineTarget, TapEngine, engine_model_from_pair
from trtllm_dflash.runtime.fake_executor import AdditionalModelOutput, OutputConfig, Request


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-runners")
    t = make_target(root / "t", "qwen3", seed=3)
    return load_pair(t, make_drafter(root / "d", t, seed=4, block_size=8))


def test_executor_config_binds_the_dflash_outputs_and_runs_tp_in_leader_mode():
    b = fake_bindings.module()
    cfg = trt_runners.executor_config(1, bindings=b)
    assert cfg.kv_cache_config.enable_block_reuse and not cfg.enable_chunked_context and cfg.max_beam_width == 1
    assert [(o.name, o.gather_context) for o in cfg.additional_model_outputs] == [
        ("dflash_ctx", True), ("dflash_tail", False), ("dflash_argmax", False)]  # not dflash_logits: engine_memory.py
    assert cfg.parallel_config is None
    for tp in (2, 4):  # one process per rank under mpirun: every rank a participant, rank r on GPU r
        p = trt_runners.executor_config(tp, bindings=b).parallel_config
        assert p.communication_type is b.CommunicationType.MPI and p.communication_mode is b.CommunicationMode.LEADER
        assert p.device_ids == list(range(tp)) and p.participant_ids == list(range(tp))
        assert p.orchestrator_config is None and p.num_nodes is None
    p = trt_runners.executor_config(4, device_ids=[4, 5, 6, 7], bindings=b).parallel_config
    assert p.device_ids == [4, 5, 6, 7] and p.participant_ids == [0, 1, 2, 3]
    p = trt_runners.executor_config(4, num_nodes=2, bindings=b).parallel_config  # device ids are per node
    assert p.device_ids == [0, 1] and p.num_nodes == 2 and p.participant_ids == [0, 1, 2, 3]
    with pytest.raises(UserError, match=r"^gpu_device_ids: 0,0: need 2 distinct GPU ids"):
        trt_runners.executor_config(2, device_ids=[0, 0], bindings=b)
    with pytest.raises(UserError, match=r"^num_nodes: 3 does not divide the world size 4"):
        trt_runners.executor_config(4, num_nodes=3, bindings=b)


def test_only_the_leader_takes_requests_and_the_other_ranks_wait_for_it():
    """open_executor: the rank the Executor says takes requests (can_enqueue_requests, the leader:
    MPI rank 0) gets the adapter; every other rank a WorkerRank, whose serve() is the Executor's
    shutdown (on a real non-leader it returns once the leader has stopped)."""
    b = fake_bindings.module()
    made = {}
    for rank in (0, 1):
        b.Executor = lambda *a, rank=rank, **k: made.setdefault(rank, fake_bindings.Executor(*a, world_rank=rank, **k))
        ex = trt_runners.open_executor("engines", 2, bindings=b)
        assert isinstance(ex, trt_runners.TrtExecutor if rank == 0 else trt_runners.WorkerRank)
    worker = trt_runners.WorkerRank(made[1])
    assert not made[1].shutdown_called
    worker.serve()
    assert made[1].shutdown_called and not made[1].can_enqueue_requests()


def _tap_executor(target, drafter, **kw):
    base = engine_model_from_pair(target, drafter, max_seq_len=64)
    d = drafter.cfg
    engine = TapEngine(target, {k: base.w[k] for k in ("dflash.fc.weight", "dflash.hidden_norm.weight")},
                       tuple(d.target_layer_ids), d.rms_norm_eps, tail=d.block_size)
    b = fake_bindings.module()
    return base, trt_runners.TrtExecutor(b.Executor(engine, config=trt_runners.executor_config(1, bindings=b), **kw), b)


def test_adapter_translates_requests_and_outputs(pair):
    target, drafter = pair
    _, ex = _tap_executor(target, drafter)
    out = OutputConfig([AdditionalModelOutput("dflash_ctx", True), AdditionalModelOutput("dflash_tail", False)])
    rid = ex.enqueue_request(Request([1, 2, 3, 4, 5], 1, out, cache_salt_id=7))  # EngineTarget's positional form
    (sent,) = ex.ex.requests
    assert sent.output_config.return_perf_metrics and sent.output_config.exclude_input_from_output
    assert sent.cache_salt_id == 7 and sent.max_tokens == 1
    (resp,) = ex.await_responses(rid, timeout_s=60.0)  # EngineTarget's wait: the binding takes a timedelta
    got = {o.name: o.output for o in resp.result.additional_outputs}
    assert got["dflash_ctx"].shape == (5, target.cfg.hidden_size)
    assert got["dflash_tail"].shape == (8, target.cfg.hidden_size)
    # A prefill over a reused prefix would return unwritten context rows: an error response instead.
    rid = ex.enqueue_request(Request([1, 2, 3, 4, 5, 6, 7, 8, 9], 1, out, cache_salt_id=7))
    (resp,) = ex.await_responses(rid)
    assert resp.has_error() and "1 KV-cache blocks were reused" in resp.error_msg
    tail_only = OutputConfig([AdditionalModelOutput("dflash_tail", False)])
    request = Request([1, 2, 3, 4, 5, 6, 7, 8, 9], 1, tail_only, cache_salt_id=7)
    (resp,) = ex.await_responses(ex.enqueue_request(request))
    assert not resp.has_error() and not ex.ex.requests[-1].output_config.return_perf_metrics


def test_bindings_stand_in_reuses_kv_only_where_the_engine_has_paged_context_fmha(pair):
    """fixExecutorConfig: an engine without paged context FMHA gets no block reuse, whatever the
    KvCacheConfig asks, so a second prefill over the same salt computes every row again."""
    target, drafter = pair
    out = OutputConfig([AdditionalModelOutput("dflash_ctx", True)])
    fp32 = {**fake_bindings.ROOMY_ENGINE, "plugin_config": {"context_fmha": False, "use_paged_context_fmha": False}}
    for engine, reused in ((fake_bindings.ROOMY_ENGINE, True), (fp32, False)):
        _, ex = _tap_executor(target, drafter, build_config=engine)
        ex.await_responses(ex.enqueue_request(Request([1, 2, 3, 4, 5], 1, out, cache_salt_id=7)))
        (resp,) = ex.await_responses(ex.enqueue_request(Request(list(range(1, 10)), 1, out, cache_salt_id=7)))
        assert resp.has_error() is reused  # TrtExecutor refuses a prefill whose rows reuse hid
        if not reused:
            assert resp.result.additional_outputs[0].output.shape[0] == 9


def test_bindings_stand_in_clamps_max_tokens_and_refuses_long_prompts(pair):
    target, drafter = pair
    small = {**fake_bindings.ROOMY_ENGINE, "max_seq_len": 12, "max_num_tokens": 10}
    _, ex = _tap_executor(target, drafter, build_config=small)
    tail = OutputConfig([AdditionalModelOutput("dflash_tail", False)])
    (resp,) = ex.await_responses(ex.enqueue_request(Request(list(range(1, 9)), 16, tail)))
    assert not resp.has_error() and ex.ex.requests[-1].max_tokens == 12 - 8  # clamped, as LlmRequest::validate does
    (resp,) = ex.await_responses(ex.enqueue_request(Request(list(range(1, 12)), 1, tail)))
    # min(max_seq_len - 1, max_num_tokens)
    assert resp.error_msg == "Prompt length (11) exceeds maximum input length (10)."


def test_a_sampling_request_is_refused_in_one_line(pair):
    """dflash_logits is not registered with the Executor (recipe/plan/engine_memory.py: it would be
    pre-allocated at max_num_tokens x block x vocab fp32): a request for it is refused by name."""
    _, ex = _tap_executor(*pair)
    logits = OutputConfig([AdditionalModelOutput("dflash_tail", False), AdditionalModelOutput("dflash_logits", False)])
    with pytest.raises(RuntimeError, match=r"^dflash_logits: not registered with the Executor.*greedily on GPU"):
        ex.enqueue_request(Request([1, 2, 3], 1, logits))


def test_engine_kv_reuse_reads_the_plan_and_the_engine(tmp_path):
    (tmp_path / "target" / "engines").mkdir(parents=True)

    def reuse(plan_reuse, paged):
        (tmp_path / "plan.json").write_text(json.dumps({"kv_block_reuse": plan_reuse}))
        cfg = {"build_config": {"plugin_config": {"use_paged_context_fmha": paged}, "gather_context_logits": False}}
        (tmp_path / "target" / "engines" / "config.json").write_text(json.dumps(cfg))
        return trt_runners.engine_kv_reuse(tmp_path)

    assert reuse(True, True) and not reuse(True, False) and not reuse(False, True)
    b = fake_bindings.module()
    assert not trt_runners.executor_config(1, kv_block_reuse=False, bindings=b).kv_cache_config.enable_block_reuse


def test_greedy_decode_through_the_adapter_and_the_drafter_runner(pair):
    target, drafter = pair
    base, ex = _tap_executor(target, drafter)
    d = drafter.cfg

    def factory(max_len):
        return ArenaDrafter(TorchDrafterSession(base.w, base.spec, base.rope, max_len=max_len), block_size=d.block_size,
                            mask_token_id=d.mask_token_id, target_layer_ids=tuple(d.target_layer_ids), max_len=max_len)

    model = EngineModel(ex, None, d, vocab_size=target.cfg.vocab_size, eos_token_ids=target.cfg.eos_token_ids,
                        drafter_factory=factory)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 4, 8], [11, 12, 13, 14, 15, 16, 17, 18, 19]]

    def tokens(m):
        dec = m.decoder(sampling=SamplingParams(), max_len=32)
        rec = dec.admit([0, 1, 2], prompts, [9, 4, 6], [[], [], []])
        out = {r: list(t) for r, t in zip(rec.seq_ids, rec.tokens)}
        while dec.running:
            rec = dec.step()
            for r, t in zip(rec.seq_ids, rec.tokens):
                out[r] += t
        return out

    assert tokens(model) == tokens(engine_model_from_pair(target, drafter, max_seq_len=64))
    assert isinstance(model.decoder(sampling=SamplingParams(), max_len=8).target, EngineTarget)


def test_open_trt_engine_refuses_a_dry_run_build(tmp_path):
    with pytest.raises(UserError, match="no plan.json; not an output of `trtllm-dflash build`"):
        trt_runners.open_trt_engine(tmp_path)
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "target" / "engines").mkdir(parents=True)
    with pytest.raises(UserError, match=r"target/engines: no rank0.engine / config.json \(a --dry-run build\?\)"):
        trt_runners.open_trt_engine(tmp_path)


@pytest.fixture(scope="module")
def tp2_build(tmp_path_factory):
    """A tp 2 build output of the shipped pair's engine recipe whose engine files are empty
    stand-ins (configs as trtllm-build writes them: pretrained_config = the checkpoint's
    config.json, build_config = the plan's), with the drafter placed by the rule: rank 0."""
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.engines.stage import build
    from trtllm_dflash.recipe import load_recipe, recipes_root

    root = tmp_path_factory.mktemp("tp2-build")
    recipe = load_recipe(recipes_root() / "cpu/tiny-pystd-engine.yaml", ["parallel.tp=2"])
    ckpt = convert(recipe, root / "convert", progress=False)
    out = build(recipe, ckpt, root / "build", dry_run=True, say=lambda _: None).out
    for role in ("target", "drafter"):
        cfg = json.loads((ckpt / role / "config.json").read_text())
        engines = out / role / "engines"
        engines.mkdir()
        (engines / "config.json").write_text(json.dumps({
            "pretrained_config": cfg, "build_config": json.loads((out / role / "build_config.json").read_text())}))
        for r in range(cfg["mapping"]["world_size"]):
            (engines / f"rank{r}.engine").write_bytes(b"")
    return out


class _Session:
    """TrtSession's stand-in: records where the drafter engine was opened."""

    opened: list = []

    def __init__(self, engine_dir, device, rank=0, peers=()):
        _Session.opened.append((Path(engine_dir).parent.name, device))


def test_open_trt_engine_places_the_drafter_on_rank_0_and_makes_the_others_workers(tp2_build, monkeypatch):
    plan = json.loads((tp2_build / "plan.json").read_text())
    assert plan["drafter_parallelism"]["placement"] == "rank0"
    config = json.loads((tp2_build / "drafter/engines/config.json").read_text())
    assert config["pretrained_config"]["mapping"]["tp_size"] == 1
    for var in ("SLURM_PROCID", "PMI_RANK", "PMI_ID"):
        monkeypatch.delenv(var, raising=False)
    cuda = fake_cuda.install(monkeypatch, 8, {}, {})  # open_trt_engine selects the rank's GPU first
    made = []
    b = fake_bindings.module()
    for rank in (1, 0):
        monkeypatch.setenv("OMPI_COMM_WORLD_RANK", str(rank))  # what mpirun gives each tritonserver
        b.Executor = lambda *a, rank=rank, **k: (
            made.append(fake_bindings.Executor(*a, world_rank=rank, **k)) or made[-1])
        _Session.opened.clear()
        model = trt_runners.open_trt_engine(tp2_build, device_ids=[3, 5], bindings=b, session_cls=_Session)
        pc = made[-1].config.parallel_config
        assert pc.communication_mode is b.CommunicationMode.LEADER and pc.device_ids == [3, 5]
        assert pc.participant_ids == [0, 1]
        if rank == 1:  # the target's shard only: no drafter engine opened here
            assert isinstance(model, trt_runners.WorkerRank) and _Session.opened == []
        else:  # the whole drafter, on rank 0's GPU (device_ids[0]), opened before the Executor sizes its KV pool
            assert isinstance(model, EngineModel) and _Session.opened == [("drafter", "cuda:3")]
            assert model.device == "cuda:3" and isinstance(model.executor, trt_runners.TrtExecutor)
        assert cuda.current == [3, 5][rank]


class _StopAtOnce:
    """A RankGroup stand-in whose rank 0 has already said stop."""

    def __init__(self, rank, world, device):
        self.rank, self.world, self.device, self.made = rank, world, device, (rank, world, device)

    def recv(self):
        return ("stop", 0)


def test_open_trt_engine_opens_every_rank_s_drafter_shard_when_split(tp2_build, tmp_path, monkeypatch):
    """A split plan: every rank opens its own drafter engine (rank{r}.engine on its GPU), and a
    worker rank serves its drafter loop until rank 0 says stop, then waits out the Executor."""
    import shutil

    out = shutil.copytree(tp2_build, tmp_path / "b")
    plan = json.loads((out / "plan.json").read_text())
    plan["drafter_parallelism"]["placement"] = "split"
    (out / "plan.json").write_text(json.dumps(plan))
    for var in ("SLURM_PROCID", "PMI_RANK", "PMI_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    fake_cuda.install(monkeypatch, 8, {}, {})
    made, groups = [], []
    b = fake_bindings.module()
    b.Executor = lambda *a, **k: made.append(fake_bindings.Executor(*a, world_rank=1, **k)) or made[-1]
    sessions = []

    class Session:
        def __init__(self, engine_dir, device, rank, peers):
            sessions.append((device, rank))
            assert peers == (3, 5)  # the split drafter's GPUs: peer access to each before its workspace

    worker = trt_runners.open_trt_engine(out, device_ids=[3, 5], bindings=b, session_cls=Session,
                                         rank_group=lambda *a: groups.append(_StopAtOnce(*a)) or groups[-1])
    assert isinstance(worker, trt_runners.WorkerRank) and sessions == [("cuda:5", 1)]
    assert groups[0].made == (1, 2, "cuda:5")
    worker.serve()
    assert made[-1].shutdown_called
    (out / "target/engines/rank1.engine").unlink()
    with pytest.raises(UserError, match=r"target/engines: no rank1.engine of its 2 ranks"):
        trt_runners.open_trt_engine(out, bindings=fake_bindings.module(), session_cls=_Session)
