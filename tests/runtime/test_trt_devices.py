"""Every rank's TensorRT objects on its own GPU: a tp 8 split-drafter build opened through
runtime/trt_runners.py open_trt_engine, rank by rank, with the real TrtSession over stand-ins that
know which device is current (tests/helpers/fake_cuda.py): each rank's drafter engine, execution
context, stream and custom all-reduce workspace are created on that rank's GPU, peer access is
enabled from it before the workspace (as tensorrt_llm/runtime/generation.py orders them), and a
drafter pass runs there."""

import json

import pytest
import torch

import fake_bindings
import fake_cuda
from trtllm_dflash.runtime import trt_runners

TP = 8
KV_HEADS, HEAD_DIM, VOCAB = 1, 64, 4096
SHAPES = {"k_cache_0": (-1, -1, KV_HEADS, HEAD_DIM), "draft_logits": (-1, -1, VOCAB)}
DTYPES = {"ctx_rows": "BF16", "k_cache_0": "BF16"}


@pytest.fixture(scope="module")
def tp8_split(tmp_path_factory):
    """A build output laid out as `trtllm-build` writes a tp 8 target and a split drafter (one
    engine per rank; the engines' bytes are empty: the stand-in runtime takes any)."""
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.engines.stage import build
    from trtllm_dflash.recipe import load_recipe, recipes_root

    root = tmp_path_factory.mktemp("tp8")
    recipe = load_recipe(recipes_root() / "cpu/tiny-pystd-engine.yaml", ["parallel.tp=2", "parallel.drafter=split"])
    ckpt = convert(recipe, root / "convert", progress=False)
    out = build(recipe, ckpt, root / "build", dry_run=True, say=lambda _: None).out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["drafter_parallelism"]["placement"] == "split"
    for role in ("target", "drafter"):
        cfg = json.loads((ckpt / role / "config.json").read_text())
        cfg["mapping"].update(world_size=TP, tp_size=TP)  # the tiny pair's heads do not split 8 ways; the layout does
        engines = out / role / "engines"
        engines.mkdir()
        build_config = json.loads((out / role / "build_config.json").read_text())
        (engines / "config.json").write_text(json.dumps({"pretrained_config": cfg, "build_config": build_config}))
        for r in range(TP):
            (engines / f"rank{r}.engine").write_bytes(b"")
    return out


class _Stop:
    """A split drafter's rank group whose rank 0 has already said stop (runtime/drafter_ranks.py)."""

    def __init__(self, rank, world, device):
        self.rank, self.world, self.device = rank, world, device

    def recv(self):
        return ("stop", 0)


def open_rank(build, rank, monkeypatch, cuda, device_ids=None):
    for var in ("SLURM_PROCID", "PMI_RANK", "PMI_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", str(rank))
    b = fake_bindings.module()
    b.Executor = lambda *a, **k: fake_bindings.Executor(*a, world_rank=rank, **k)
    cuda.events.clear()
    return trt_runners.open_trt_engine(build, device_ids=device_ids, bindings=b, rank_group=_Stop)


@pytest.mark.parametrize("device_ids", [None, [7, 6, 5, 4, 3, 2, 1, 0]], ids=["default", "reversed"])
def test_every_rank_creates_its_drafter_engine_stream_and_workspace_on_its_own_gpu(tp8_split, monkeypatch, device_ids):
    cuda = fake_cuda.install(monkeypatch, TP, SHAPES, DTYPES)
    for rank in range(TP):
        gpu = rank if device_ids is None else device_ids[rank]
        open_rank(tp8_split, rank, monkeypatch, cuda, device_ids)
        made = [e for e in cuda.events if e[0] in ("engine", "context", "stream", "workspace")]
        assert {e[0] for e in made} == {"engine", "context", "stream", "workspace"}, made
        assert all(e[1] == gpu for e in made), f"rank {rank} (GPU {gpu}): {made}"
        peers = [e for e in cuda.events if e[0] == "peer"]
        assert sorted(e[2] for e in peers) == sorted(set(range(TP)) - {gpu} if device_ids is None
                                                       else set(device_ids) - {gpu})
        assert all(e[1] == gpu for e in peers), peers  # enabled from the rank's own device
        first_workspace = next(i for i, e in enumerate(cuda.events) if e[0] == "workspace")
        assert max(i for i, e in enumerate(cuda.events) if e[0] == "peer") < first_workspace


def test_a_drafter_pass_runs_on_the_engines_gpu_whatever_device_is_current(tp8_split, monkeypatch):
    cuda = fake_cuda.install(monkeypatch, TP, SHAPES, DTYPES)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    cuda.set_device(5)
    session = trt_runners.TrtSession(tp8_split / "drafter" / "engines", "cuda:5", rank=5)
    cuda.set_device(0)  # another thread (the Executor's, a stub's) left device 0 current
    x = torch.zeros(2, 3)
    session.run({"ctx_rows": x}, {"draft_logits": x})
    assert ("execute", 5) in cuda.events


def test_gpu_device_ids_at_tp_1_are_refused_for_cuda_visible_devices(tmp_path, monkeypatch):
    """At one rank there is no ParallelConfig: 1.2.1's Executor drives the first visible GPU, so a
    gpu_device_ids of another GPU would be silently ignored (the drafter engine there, the target
    on GPU 0)."""
    from trtllm_dflash.errors import UserError

    build = tmp_path / "b"
    for role in ("target", "drafter"):
        engines = build / role / "engines"
        engines.mkdir(parents=True)
        (engines / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"world_size": 1}}}))
        (engines / "rank0.engine").write_bytes(b"")
    (build / "plan.json").write_text("{}")
    with pytest.raises(UserError, match="gpu_device_ids: 3 at tp 1: .* CUDA_VISIBLE_DEVICES"):
        trt_runners.open_trt_engine(build, device_ids=[3], bindings=fake_bindings.module())
