"""The reference backend over a converted or quantized checkpoint, tensor-parallel.

`open_checkpoint(DIR)` loads the TensorRT-LLM layout `convert` / `quantize` wrote (`target/` and
`drafter/`, `rank{r}.safetensors` each): in this process for tp = 1 (`batcher.LocalModel`), else
in `tp` processes that each hold only their rank's shard, joined by torch.distributed (gloo on
CPU, NCCL on GPU) (`ShardedModel`). Either hands out reference Decoders, so the serving batcher
serves exactly the checkpoint that was deployed, and `checkpoint_steps` (`generate
--checkpoint`) yields the same `StepRecord`s as `reference.generate_steps`.

Per rank (the checkpoint's splits, weight_maps.py):
  attention   q/k/v column-parallel by heads (KV heads replicated when tp > num_kv_heads),
              o_proj row-parallel: the attention output is all-reduced
  MLP         gate/up column-parallel, down row-parallel: the MLP output is all-reduced;
              MoE: every expert's FFN width split, router replicated, the block output all-reduced
  embedding   vocab-parallel: each rank looks up its rows (others zero), then all-reduce
  LM head     vocab-parallel: local logits, all-gathered on the vocabulary axis
  drafter     the same, and fc column-parallel with its output all-gathered before hidden_norm;
              a drafter checkpoint kept whole (engine backend, placement rank0: recipe/planner.py
              drafter_placement) is loaded whole on every rank here (the reference runners), and
              on rank 0 only by the emulated engine runners, which broadcast its drafts
  norms       replicated; row-parallel biases live on rank 0 only (summed once)
Quantized tensors (FP8 / NVFP4 weights with their scales) are dequantized on load into the
compute dtype: the reference emulates quantized weights; activations and the KV cache stay in
high precision.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import socket
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_dflash.deploy.settings import CPU_RUNNERS
from trtllm_dflash.errors import UserError
from trtllm_dflash.recipe.hardware import cpu_torch_threads
from trtllm_dflash.reference.generate import Trim


# ----------------------------------------------------------------------------- collectives


class Comm:
    """The tensor-parallel group of this process (world 1: every collective is the identity)."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x on the last axis, in rank order."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x on every rank (x: a buffer of the same shape and dtype elsewhere)."""
        if self.world > 1:
            torch.distributed.broadcast(x, src=0)
        return x


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the embedding; ids outside them contribute zeros."""

    def __init__(self, n: int, hidden: int, start: int, comm: Comm):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, hidden))
        self.start, self.comm = start, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * inside[..., None]  # [B, T, H]
        return self.comm.all_reduce(x)


class GatherLinear(nn.Module):
    """Column-parallel linear whose output is all-gathered (LM head over the vocabulary, drafter fc)."""

    def __init__(self, in_features: int, out_local: int, comm: Comm):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_local, in_features))
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_last(F.linear(x, self.weight))


# ----------------------------------------------------------------------------- the checkpoint


@dataclass(frozen=True)
class CheckpointInfo:
    directory: Path
    tp: int
    target_cfg: object  # reference TargetConfig (global sizes)
    drafter_cfg: object  # reference DraftConfig
    dtype: torch.dtype  # the checkpoint's high-precision dtype
    quantization: dict  # role -> config.json quantization section
    tokenizer_dir: Path | None
    manifest: object  # artifacts.Manifest of the stage output
    drafter_tp: int = 0  # ranks the drafter checkpoint is split over: tp, or 1 (kept whole); 0 = tp

    @property
    def drafter_whole(self) -> bool:
        """The drafter checkpoint is one rank file under a tensor-parallel target."""
        return self.tp > 1 and self.drafter_tp == 1


def reference_configs(tc: dict, dc: dict, target_dir: Path, drafter_dir: Path):
    """The reference TargetConfig / DraftConfig of a TensorRT-LLM target and drafter config.json
    (checkpoint or engine: tc / dc hold `hf_config`), the target's eos ids merged with its
    generation_config's."""
    from trtllm_dflash.reference.config import DraftConfig, TargetConfig

    tcfg = TargetConfig.from_dict(tc["hf_config"], f"{target_dir}/config.json hf_config")
    eos = (tc.get("generation_config") or {}).get("eos_token_id")
    eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
    tcfg = dataclasses.replace(tcfg, eos_token_ids=tuple(dict.fromkeys([*tcfg.eos_token_ids, *eos])))
    return tcfg, DraftConfig.from_dict(dc["hf_config"], f"{drafter_dir}/config.json hf_config")


def read_checkpoint(directory: str | Path) -> CheckpointInfo:
    """Check a convert / quantize output in the TensorRT-LLM layout and read its configs."""
    from trtllm_dflash.artifacts import Manifest

    directory = Path(directory)
    m = Manifest.read(directory)
    if m.stage not in ("convert", "quantize"):
        raise UserError(f"{directory}: a {m.stage} output; --checkpoint takes a convert or quantize output")
    if m.extra.get("layout") != "trtllm":
        raise UserError(
            f"{directory}: layout {m.extra.get('layout')!r}; the reference runs the TensorRT-LLM layout "
            "(convert / quantize a recipe with the reference or engine backend, or convert --layout trtllm)"
        )
    cfgs = {}
    for role in ("target", "drafter"):
        path = directory / role / "config.json"
        if not path.is_file():
            raise UserError(f"{directory}: missing {role}/config.json")
        cfgs[role] = json.loads(path.read_text())
    tc = cfgs["target"]
    tcfg, dcfg = reference_configs(tc, cfgs["drafter"], directory / "target", directory / "drafter")
    tp = tc["mapping"]["tp_size"]
    dtp = (cfgs["drafter"].get("mapping") or {}).get("tp_size", tp)
    if dtp not in (1, tp):
        raise UserError(f"{directory / 'drafter' / 'config.json'}: mapping.tp_size {dtp}: a drafter is split like "
                        f"the target (tp {tp}) or kept whole (1); convert again")
    tok = directory / "tokenizer"
    has_tok = any((tok / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    return CheckpointInfo(
        directory, tp, tcfg, dcfg, getattr(torch, tc["dtype"]),
        {r: c.get("quantization") or {} for r, c in cfgs.items()}, tok if has_tok else None, m, dtp,
    )


def _dequantized(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """FP8 / NVFP4 weights with their scales -> plain weights; scale tensors are consumed."""
    from trtllm_dflash.quantize.formats import dequantize_fp8, dequantize_nvfp4

    out = {}
    for name, t in tensors.items():
        if name.endswith(("_scaling_factor", "_scaling_factor_2")):
            continue
        prefix = name.removesuffix(".weight")
        if t.dtype == torch.float8_e4m3fn:
            t = dequantize_fp8(t, tensors[f"{prefix}.weights_scaling_factor"].reshape(()), dtype)
        elif t.dtype == torch.uint8:
            t = dequantize_nvfp4(t, tensors[f"{prefix}.weights_scaling_factor"], tensors[f"{prefix}.weights_scaling_factor_2"], dtype)
        out[name] = t
    return out


def _read_rank(directory: Path, role: str, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = directory / role / f"rank{rank}.safetensors"
    if not path.is_file():
        raise UserError(f"{directory}: missing {role}/rank{rank}.safetensors")
    return _dequantized(load_file(path), dtype)


def read_rank(info: CheckpointInfo, role: str, rank: int, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """One rank's tensors of `role` under their checkpoint names, quantized weights dequantized."""
    return {k: v.to(device) for k, v in _read_rank(info.directory, role, rank, dtype).items()}


def _state(arch_map, layers: list[tuple], tensors: dict[str, torch.Tensor], local_heads, experts: int,
           strip_model: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A rank's TensorRT-LLM tensors -> reference parameter names (entries from `origin` target skipped)."""
    from trtllm_dflash.convert.weight_maps import split_back

    state = {}
    for entry, layer in layers:
        if entry.origin == "target":
            continue
        name = entry.dst.replace("{}", str(layer)) if layer is not None else entry.dst
        if name not in tensors:
            raise UserError(f"checkpoint rank file: missing tensor {name}")
        for src, x in split_back(entry, layer, tensors[name], local_heads, experts).items():
            key = src.removeprefix("model.") if strip_model else src
            state[key] = x.to(dtype)
    return state


def load_rank(info: CheckpointInfo, comm: Comm, dtype: torch.dtype | None = None, device: str = "cpu"):
    """The reference target and drafter of one rank, holding only that rank's shard (the whole
    drafter where its checkpoint keeps it whole: then no drafter collectives)."""
    drafter_comm = Comm() if info.drafter_whole else comm
    return load_target(info, comm, dtype, device), _load_drafter(info, drafter_comm, dtype, device)


def load_target(info: CheckpointInfo, comm: Comm, dtype: torch.dtype | None = None, device: str = "cpu"):
    """The reference target of one rank: its shard of the target checkpoint."""
    from trtllm_dflash.convert.weight_maps import WEIGHT_MAPS, Heads, model_entries
    from trtllm_dflash.reference.target import Target

    dtype = dtype or info.dtype
    tp, rank, t = comm.world, comm.rank, info.target_cfg
    heads = Heads(t.num_heads, t.num_kv_heads, t.head_dim).local(tp)
    moe = t.moe and dataclasses.replace(t.moe, intermediate_size=t.moe.intermediate_size // tp)
    local = dataclasses.replace(t, num_heads=heads.num_heads, num_kv_heads=heads.num_kv_heads,
                                intermediate_size=t.intermediate_size // tp, moe=moe)
    with torch.device("meta"):
        target = Target(local)
        vocab = t.vocab_size // tp
        target.embed_tokens = VocabParallelEmbedding(vocab, t.hidden_size, rank * vocab, comm)
        target.lm_head = GatherLinear(t.hidden_size, vocab, comm)
    tensors = _read_rank(info.directory, "target", rank, dtype)
    state = _state(WEIGHT_MAPS[t.arch], model_entries(WEIGHT_MAPS[t.arch], t), tensors, heads,
                   t.moe.num_experts if t.moe else 0, True, dtype)
    return _finish(target, state, t, comm, device)


def _load_drafter(info: CheckpointInfo, comm: Comm, dtype: torch.dtype | None, device: str):
    """The reference drafter of one rank of `comm` (world 1: the whole drafter, rank file 0)."""
    from trtllm_dflash.convert.weight_maps import DRAFTER_MAP, Heads, model_entries
    from trtllm_dflash.reference.draft import DFlashDraft

    dtype = dtype or info.dtype
    tp, d = comm.world, info.drafter_cfg
    heads = Heads(d.num_heads, d.num_kv_heads, d.head_dim).local(tp)
    local = dataclasses.replace(d, num_heads=heads.num_heads, num_kv_heads=heads.num_kv_heads,
                                intermediate_size=d.intermediate_size // tp)
    with torch.device("meta"):
        drafter = DFlashDraft(local)
        drafter.fc = GatherLinear(len(d.target_layer_ids) * d.hidden_size, d.hidden_size // tp, comm)
    tensors = _read_rank(info.directory, "drafter", comm.rank, dtype)
    state = _state(DRAFTER_MAP, model_entries(DRAFTER_MAP, d, drafter=True), tensors, heads, 0, False, dtype)
    return _finish(drafter, state, d, comm, device)


def _finish(model, state: dict, cfg, comm: Comm, device: str):
    """Load a rank's state into a meta-built model, its RoPE, and (tp > 1) the all-reduce after
    every attention and MLP block; row-parallel biases are added once, after the all-reduce."""
    from trtllm_dflash.reference.target import Rope

    if comm.rank != 0:
        for k in [k for k in state if k.endswith(("o_proj.bias", "down_proj.bias"))]:
            state[k] = torch.zeros_like(state[k])
    model.load_state_dict(state, strict=True, assign=True)
    model.rope = Rope(cfg.rope, cfg.head_dim)
    model.to(device).eval()
    if comm.world > 1:
        for layer in model.layers:
            for module in (layer.self_attn, layer.mlp):
                module.register_forward_hook(lambda _m, _i, out: comm.all_reduce(out))
    return model


# ----------------------------------------------------------------------------- running


def checkpoint_paths(args) -> tuple[Path, Path, int | None, int | None]:
    """For `generate --checkpoint DIR`: (tokenizer directory, checkpoint, block size, DDTree budget)."""
    if args.target is not None or args.drafter is not None or args.recipe is not None:
        raise UserError("--checkpoint replaces --target/--drafter/--recipe; give one or the other")
    info = read_checkpoint(args.checkpoint)
    return info.tokenizer_dir or info.directory / "tokenizer", info.directory, args.block_size, args.ddtree_budget


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _emulated_model(info, comm, dtype: torch.dtype | None, device: str, max_seq_len: int):
    """The engine runners on CPU over one rank of a convert / quantize output: FakeExecutor over
    TapEngine (this rank's target shard + its part of the drafter's fc and hidden_norm, read as
    the target engine reads them: build/engine_io.py tap_weights) for the target, the torch
    drafter network for the drafter, placed as the checkpoint keeps it (recipe/planner.py
    drafter_placement): this rank's drafter shard, or the whole drafter on rank 0 only, whose
    drafts every rank then receives (engine_runners.Rank0Drafter)."""
    from trtllm_dflash.build.engine_io import tap_weights
    from trtllm_dflash.serve.engine_runners import EngineModel, FakeExecutor, TapEngine

    dtype = dtype or info.dtype
    target = load_target(info, comm, dtype, device)
    d = info.drafter_cfg
    tap = {k: v.to(device) for k, v in tap_weights(info.directory / "target", comm.rank, dtype).items()}
    engine = TapEngine(target, tap, tuple(d.target_layer_ids), d.rms_norm_eps, tail=d.block_size, comm=comm)
    executor = FakeExecutor(engine, max_seq_len=max_seq_len + d.block_size, max_input_len=max_seq_len + d.block_size)
    common = dict(vocab_size=info.target_cfg.vocab_size, eos_token_ids=info.target_cfg.eos_token_ids, device=device)
    if not info.drafter_whole:
        return EngineModel(executor, read_rank(info, "drafter", comm.rank, dtype, device), d, comm=comm, **common)
    weights = read_rank(info, "drafter", 0, dtype, device) if comm.rank == 0 else None
    return EngineModel(executor, weights, d, rank0_of=comm, draft_dtype=dtype, **common)


def _rank_model(runners: str, info: CheckpointInfo, comm: Comm, dtype, device: str, max_seq_len: int):
    """One rank's model: the reference runners over its shard, or the engine runners (design C,
    FakeExecutor + the torch drafter network) over it."""
    if runners == "emulated":
        return _emulated_model(info, comm, dtype, device, max_seq_len)
    from trtllm_dflash.serve.batcher import LocalModel

    return LocalModel(*load_rank(info, comm, dtype, device))


def _worker(rank: int, tp: int, port: int, directory: str, dtype, device: str, runners: str, max_seq_len: int,
            commands: list, replies) -> None:
    """One rank: load its shard, then run Decoder calls as they come (every rank gets every call,
    in the same order, so their collectives match); rank 0 answers each call."""
    torch.set_num_threads(cpu_torch_threads(tp))
    dev = f"cuda:{rank}" if device.startswith("cuda") else device
    if dev.startswith("cuda"):
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        "nccl" if dev.startswith("cuda") else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp
    )
    answer = replies.put if rank == 0 else (lambda _: None)
    try:
        model = _rank_model(runners, read_checkpoint(directory), Comm(rank, tp), dtype, dev, max_seq_len)
        decoders: dict = {}
        answer(("ok", None, 0))
        while (cmd := commands[rank].get())[0] != "stop":
            op, did, *rest = cmd
            try:
                result = None
                if op == "new":
                    decoders[did] = model.decoder(**rest[0])
                elif op == "call":
                    result = getattr(decoders[did], rest[0])(*rest[1])
                else:  # "release"
                    decoders.pop(did, None)
                answer(("ok", result, decoders[did].running if did in decoders else 0))
            except UserError as e:
                answer(("error", str(e), 0))
        # Every rank finishes its last collective before any rank tears down its group: a
        # rank that exits while its peer is still inside gloo makes the peer abort.
        torch.distributed.barrier()
    except BaseException as e:
        answer(("fatal", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}", 0))
        raise
    finally:
        torch.distributed.destroy_process_group()


class RankFailed(UserError):
    """A tensor-parallel rank died or failed: the model can no longer serve any request."""


class ShardedModel:
    """The reference target + drafter of a checkpoint in `tp` worker processes (torch.distributed:
    gloo on CPU, NCCL on GPU), each holding only its rank's shard. `decoder()` returns a proxy
    with the reference Decoder's interface (admit / step / cancel / running) whose calls run on
    every rank; the serving batcher and `checkpoint_steps` drive it like a local Decoder.

    If a rank dies (or raises), the call that finds out raises RankFailed naming the rank and how
    it ended, the surviving ranks are stopped (a peer of a dead rank would wait in a collective),
    and every later call raises the same at once: `failed` holds the reason."""

    failed: str | None = None

    def __init__(self, info: CheckpointInfo, tp: int, dtype: torch.dtype | None, device: str,
                 runners: str = "reference", max_seq_len: int = 2048):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.eos_token_ids = info.target_cfg.eos_token_ids
        self._commands = [ctx.Queue() for _ in range(tp)]
        self._replies = ctx.Queue()
        self._next = 0
        self._procs = mp.start_processes(
            _worker, args=(tp, _free_port(), str(info.directory), dtype, device, runners, max_seq_len, self._commands,
                           self._replies),
            nprocs=tp, join=False, start_method="spawn",
        )
        self._reply()  # rank 0 loaded its shard

    @property
    def pids(self) -> list[int]:
        """The rank processes' ids, in rank order."""
        return [p.pid for p in self._procs.processes]

    def _reply(self):
        while True:
            try:
                kind, result, running = self._replies.get(timeout=0.2)
            except queue.Empty:
                if any(p.exitcode is not None for p in self._procs.processes):
                    self._fail("")
                continue
            if kind == "fatal":
                self._fail(result, reporter=0)  # only rank 0 answers
            if kind == "error":
                raise UserError(result)
            return result, running

    def _fail(self, detail: str, reporter: int | None = None):
        """Record why the model cannot serve, stop the ranks still running, raise RankFailed.

        `detail` is what rank `reporter` raised, if one did. The reason names the cause
        first, whichever failure the serving loop saw first: the ranks (other than the reporting
        one) that had ended when the failure was seen or were killed by a signal, then what the
        rank raised, then the ranks that exited after it (a peer of a failed rank fails in its
        next collective). So a killed rank 1 comes before rank 0's collective error and rank 0
        raising alone before rank 1's exit that followed."""
        import time

        others = {r: p for r, p in enumerate(self._procs.processes) if r != reporter}
        gone = lambda: [r for r, p in others.items() if p.exitcode is not None]  # noqa: E731
        seen = set(gone())
        deadline = time.monotonic() + 0.5  # a dead peer's exit shows within ms of its sockets closing
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # let the peers of a dead rank fail in their next collective
        ended = gone()
        cause = sorted((r for r in ended if r in seen or others[r].exitcode < 0),
                       key=lambda r: (others[r].exitcode >= 0, r))  # signals first: the likelier cause
        words = lambda ranks: "; ".join(f"rank {r} {_how_ended(others[r].exitcode)}" for r in ranks)  # noqa: E731
        parts = [words(cause), detail.splitlines()[0] if detail else "", words(r for r in ended if r not in cause)]
        self.failed = (f"tensor-parallel {'; '.join(x for x in parts if x)}: this model cannot serve any more "
                       "requests; restart the server")
        for p in self._procs.processes:
            if p.is_alive():
                p.terminate()
        raise RankFailed(self.failed)

    def _send(self, *cmd):
        if self.failed:
            raise RankFailed(self.failed)
        for q in self._commands:
            q.put(cmd)
        return self._reply()

    def decoder(self, *, sampling, mode: str = "dflash", block_size: int | None = None,
                ddtree_budget: int | None = None, max_len: int = 2048) -> "_RemoteDecoder":
        self._next += 1
        self._send("new", self._next, dict(sampling=sampling, mode=mode, block_size=block_size,
                                           ddtree_budget=ddtree_budget, max_len=max_len))
        return _RemoteDecoder(self, self._next)

    def release(self, decoder: "_RemoteDecoder") -> None:
        if not self.failed:  # a failed model's ranks are gone: nothing to release
            self._send("release", decoder.did)

    def close(self) -> None:
        for q in self._commands:
            q.put(("stop", 0))
        try:
            while not self.failed and not self._procs.join(timeout=30):
                pass
        finally:
            for p in self._procs.processes:
                if p.is_alive():
                    p.terminate()


def _how_ended(exitcode: int) -> str:
    """A process exit code in words: 'exited with code 1' or 'was killed by SIGKILL'."""
    import signal

    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


class _RemoteDecoder:
    """A Decoder living on every rank of a ShardedModel; rank 0's results come back."""

    def __init__(self, model: ShardedModel, did: int):
        self.model, self.did, self.running = model, did, 0

    def _call(self, method: str, *args):
        result, self.running = self.model._send("call", self.did, method, args)
        return result

    def admit(self, ids: Sequence[int], prompts: Sequence[Sequence[int]], limits: Sequence[int],
              stops: Sequence[Sequence[int]], bad_words: Sequence[Sequence[Sequence[int]] | None] | None = None,
              logprobs: Sequence[bool] | None = None):
        bad = None if bad_words is None else [None if w is None else [list(x) for x in w] for w in bad_words]
        return self._call("admit", list(ids), [list(p) for p in prompts], list(limits), [list(s) for s in stops], bad,
                          None if logprobs is None else list(logprobs))

    def step(self, draft_len: int | Sequence[int] | Mapping[int, int] | None = None, tree_budget: int | None = None,
             trim: Trim | None = None):
        # trim (a policy's bound method) travels pickled: every rank trims with the same state
        # from the same drafter logits, so the ranks' rounds stay identical
        return self._call("step", draft_len, tree_budget, trim)

    def cancel(self, ids: Sequence[int]) -> None:
        self._call("cancel", list(ids))


def open_checkpoint(directory: str | Path, tp: int | None = None, dtype: torch.dtype | None = None,
                    device: str = "cpu", runners: str = "reference", max_seq_len: int = 2048):
    """A convert / quantize output, ready to decode: one model in this process (tp == 1) or a
    `ShardedModel` (tp worker processes). runners: "reference" (our torch modules) or "emulated"
    (the engine backend's runners over FakeExecutor). tp defaults to the checkpoint's (it is
    sharded for exactly that many ranks); max_seq_len bounds an emulated engine's requests."""
    if runners not in CPU_RUNNERS:  # what decodes a checkpoint: our torch modules, or the engine runners
        raise UserError(f"runners {runners!r}: allowed: {', '.join(CPU_RUNNERS)}")
    info = read_checkpoint(directory)
    tp = tp or info.tp
    if tp != info.tp:
        raise UserError(f"--tp {tp}: {directory} is sharded for tp={info.tp} (mapping.tp_size); convert again for another tp")
    if device.startswith("cuda") and tp > torch.cuda.device_count():
        raise UserError(f"--tp {tp} on {device} needs {tp} GPUs, found {torch.cuda.device_count()}")
    if tp == 1:
        return _rank_model(runners, info, Comm(), dtype, device, max_seq_len)
    return ShardedModel(info, tp, dtype, device, runners, max_seq_len)


def checkpoint_steps(
    directory: str | Path,
    prompts: Sequence[Sequence[int]],
    max_new_tokens,
    tp: int | None = None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    mode: str = "dflash",
    block_size: int | None = None,
    ddtree_budget: int | None = None,
    sampling=None,
    stop_token_ids: Sequence[int] | None = None,
    runners: str = "reference",
) -> Iterator:
    """`reference.generate_steps` over a converted / quantized checkpoint, in `tp` processes,
    with the reference runners or the emulated engine runners."""
    from trtllm_dflash.reference.verify import SamplingParams

    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    model = open_checkpoint(directory, tp, dtype, device, runners, max(len(p) for p in prompts) + max(limits))
    try:
        decoder = model.decoder(mode=mode, block_size=block_size, ddtree_budget=ddtree_budget,
                                sampling=sampling or SamplingParams(),
                                max_len=max(len(p) for p in prompts) + max(limits))
        stops = list(model.eos_token_ids if stop_token_ids is None else stop_token_ids)
        yield decoder.admit(list(range(len(prompts))), prompts, limits, [stops] * len(prompts))
        while decoder.running:
            yield decoder.step()
    finally:
        model.close()
