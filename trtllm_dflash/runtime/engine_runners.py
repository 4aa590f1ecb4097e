"""The engine backend's runners (design C): the round loop of reference/generate.py over
TensorRT-LLM 1.2.1 engines, or over their CPU stand-ins.

  EngineTarget    TargetRunner over an Executor: every round, one context request per running
                  sequence (its committed tokens + [anchor, drafts] as prompt tokens, max_tokens 1,
                  a per-sequence cache salt so only its own prefix is reused). Prefill asks for
                  `dflash_ctx` (gather_context: one fused context row per prompt token); verify
                  asks for the per-sequence tails: `dflash_tail` (the fused rows of the last
                  `tail` positions) and `dflash_logits` (their logits) or `dflash_argmax` (greedy)
  EngineDrafter   DrafterRunner over the drafter network (runtime/networks.py) with TorchOps and
                  an Arena: the CPU implementation of the drafter engine
  TapEngine       the CPU stand-in of the target engine that FakeExecutor runs: our reference
                  Target plus the tap network, full sequences, the engine's output names
  EngineModel     what the serving batcher asks for decoders (same interface as LocalModel)

The TensorRT runners (the real Executor and the drafter engine) are in trt_runners.py, GPU-only; the
drafter engine's runner (ArenaDrafter) is runtime/drafter_runner.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import torch

from trtllm_dflash.formats.engine_io import TAP_WEIGHTS
from trtllm_dflash.formats.weight_maps import Heads
from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.reference.runners import PAD, RowsFailed, causal_mask
from trtllm_dflash.reference.target import Rope, Target
from trtllm_dflash.runtime.capabilities import Capabilities, of_outputs
from trtllm_dflash.runtime.executor_health import ExecutorHealth
from trtllm_dflash.runtime.fake_executor import (
    AdditionalModelOutput,
    FakeExecutor,
    OutputConfig,
    Request,
)
from trtllm_dflash.runtime.networks import DrafterSpec, drafter_forward, target_tap
from trtllm_dflash.runtime.ops_torch import Arena, SingleRank, TorchOps

# The target engine's extra outputs (build stage I/O, trtllm_models.py): per token or per sequence.
ENGINE_OUTPUTS = {"dflash_ctx": "token", "dflash_tail": "sequence", "dflash_logits": "sequence",
                  "dflash_argmax": "sequence"}


class TapEngine:
    """CPU stand-in of the target engine: Target forward over whole sequences, the fused
    context rows (target_tap), and the last `tail` positions' rows, logits and argmax."""

    output_kinds = ENGINE_OUTPUTS

    def __init__(self, target: Target, tap_weights: dict[str, torch.Tensor], capture: tuple[int, ...], eps: float,
                 tail: int, comm=SingleRank()):
        self.target, self.capture, self.eps, self.tail = target, capture, eps, tail
        self.tap = TorchOps(tap_weights, comm=comm)

    @torch.inference_mode()
    def run(self, sequences):
        dev = self.target.device
        lengths = [len(s) for s in sequences]
        B, L = len(sequences), max(lengths)
        tok = torch.zeros(B, L, dtype=torch.long, device=dev)  # right-padded
        for b, s in enumerate(sequences):
            tok[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        pos = torch.arange(L, device=dev).expand(B, -1)
        cache = self.target.new_cache(B, L)
        n = torch.tensor(lengths, device=dev)[:, None]
        # [B, tail]: the last positions
        rows = (torch.arange(self.tail, device=dev)[None, :] + n - self.tail).clamp(min=0)
        logits, feats = self.target(tok, pos, cache, L, causal_mask(torch.zeros(B, dtype=torch.long, device=dev), L, L),
                                    self.capture, logits_at=rows)  # [B, tail, V], [B, L, n*H]
        ctx = target_tap(self.tap, [feats], self.eps)  # [B, L, H]
        out = []
        for b, length in enumerate(lengths):
            out.append({"logits": logits[b, -1], "dflash_ctx": ctx[b, :length], "dflash_tail": ctx[b, rows[b]],
                        "dflash_logits": logits[b], "dflash_argmax": logits[b].argmax(-1).to(torch.int32)})
        return out


class EngineTarget:
    """TargetRunner over a 1.2.1 Executor (or FakeExecutor) serving the DFlash target engine."""

    _salts = itertools.count(1)
    packed = True  # each row is a request of its own: verify runs only its own anchor + drafts

    def __init__(self, executor, *, vocab_size: int, eos_token_ids: tuple[int, ...], tail: int,
                 greedy: bool, device: torch.device | str = "cpu", health: ExecutorHealth | None = None):
        self.ex, self.tail, self.greedy = executor, tail, greedy
        self.health = health or ExecutorHealth()
        self.full_logits = False  # set by the decoder: a greedy decoder whose requests need the full logits
        self.vocab_size, self.eos_token_ids, self.device = vocab_size, eos_token_ids, torch.device(device)
        self.salt: list[int] = []
        # every row's sequence: its committed tokens, then those its last verify ran (anchor + drafts),
        # kept in place: a round cuts it at the row's new position and appends what it runs
        self.seq: list[list[int]] = []
        self.committed: list[int] = []  # how many of them are committed (the row's position at its last verify)
        self.ran: list[int] = []  # how many its last verify ran

    def _requests(self, inputs: list[list[int]], salts: list[int],
                  names: list[tuple[str, bool]]) -> tuple[list[dict], dict[int, str]]:
        """One context request per row, enqueued in one call (so that the Executor's first step may
        take them all): each row's outputs by name, and the rows whose request failed {row:
        message} (their outputs: a row that did not fail, zeroed; the pass raises RowsFailed). A
        pass whose every row failed raises RowsFailed without a result."""
        outputs = OutputConfig([AdditionalModelOutput(n, gather_context=g) for n, g in names])
        ids = self.ex.enqueue_requests([Request(inp, 1, outputs, cache_salt_id=s) for inp, s in zip(inputs, salts)])
        # Every response is awaited before a failure is raised: one left in the Executor keeps its
        # pinned output buffers for the life of the process (a hung Executor, condemned, excepted).
        responses = []
        for rid in ids:
            got = self.ex.await_responses(rid, timeout_s=self.health.hung_s)  # [] once it ran out
            if not got:
                raise RuntimeError(self.health.hung())
            responses.append(got[0])
        errors = [r.error_msg if r.has_error() else None for r in responses]
        self.health.saw(errors)
        failed = {b: _error_line(e) for b, e in enumerate(errors) if e is not None}
        if len(failed) == len(responses):
            raise RowsFailed(failed, None)
        outs = [None if e is not None else {o.name: o.output for o in r.result.additional_outputs}
                for r, e in zip(responses, errors)]
        if failed:  # stacking needs every row: a failed row's outputs are a good row's, zeroed
            good = next(o for o in outs if o is not None)
            outs = [o if o is not None else {k: torch.zeros_like(torch.as_tensor(v)) for k, v in good.items()}
                    for o in outs]
        return outs, failed

    def _scores(self, outs: list[dict]) -> torch.Tensor:
        """Every row's tail scores [B, tail, ...]: the logits [B, tail, V], or, from a greedy
        engine, its argmax ids [B, tail] (integers: the loop takes them as its argmax) unless the
        decoder asked for the full logits (bad words or log-probabilities)."""
        if not self._argmax_only:
            return self._stacked(outs, "dflash_logits").float()
        return self._stacked(outs, "dflash_argmax").long()

    def _stacked(self, outs: list[dict], name: str) -> torch.Tensor:
        return torch.stack([torch.as_tensor(out[name]) for out in outs]).to(self.device)

    def _tail(self) -> list[tuple[str, bool]]:
        return [("dflash_tail", False), ("dflash_argmax" if self._argmax_only else "dflash_logits", False)]

    @property
    def _argmax_only(self) -> bool:
        return self.greedy and not self.full_logits

    def prefill(self, prompts):
        salts = [next(self._salts) for _ in prompts]
        outs, failed = self._requests(prompts, salts, [("dflash_ctx", True), *self._tail()])
        P = max(len(p) for p in prompts)
        ctx0 = torch.as_tensor(outs[0]["dflash_ctx"])
        feats = torch.zeros(len(prompts), P, ctx0.shape[-1], dtype=ctx0.dtype, device=self.device)
        for b, (p, out) in enumerate(zip(prompts, outs)):
            if b in failed:  # its rows stay zero: the decoder ends the row
                continue
            rows = torch.as_tensor(out["dflash_ctx"])
            if rows.shape[0] != len(p):  # a reused prefix has no context rows (1.2.1 rule)
                raise RuntimeError(f"prefill returned {rows.shape[0]} context rows for a {len(p)}-token "
                                   "prompt: KV reuse hid some (the cache salt must be new)")
            feats[b, : len(p)] = rows
        self.salt += salts
        self.seq += [list(p) for p in prompts]
        self.committed += [len(p) for p in prompts]
        self.ran += [0] * len(prompts)
        return _partly(failed, (self._scores(outs)[:, -1], feats))

    def verify(self, tokens, start, lengths=None):
        B, T = tokens.shape
        if T > self.tail:
            raise RuntimeError(f"verify block of {T} tokens is longer than the engine's tail of {self.tail} rows")
        own = [T] * B if lengths is None else [n + 1 for n in lengths.tolist()]  # tokens each row runs
        for b, (s, row, seq) in enumerate(zip(start.tolist(), tokens.tolist(), self.seq)):  # one read each
            # the anchor and accepted drafts of the last round are committed now, the rest is cut
            assert self.committed[b] <= s <= self.committed[b] + self.ran[b], f"row {b}: position {s}"
            del seq[s:]
            seq += row[: own[b]]
            self.committed[b], self.ran[b] = s, own[b]
        outs, failed = self._requests(self.seq, self.salt, self._tail())
        scores, rows = self._scores(outs), self._stacked(outs, "dflash_tail")  # [B, tail(, V)], [B, tail, H]
        if lengths is None:  # every row ran T: its last T tail rows
            return _partly(failed, (scores[:, self.tail - T :], rows[:, self.tail - T :]))
        # row b's own tokens are the last own[b] of its tail: gather them to the front of [B, T]
        n = torch.tensor(own, device=self.device)[:, None]
        idx = (torch.arange(T, device=self.device)[None, :] + self.tail - n).clamp(max=self.tail - 1)  # [B, T]
        b = torch.arange(B, device=self.device)[:, None]
        return _partly(failed, (scores[b, idx], rows[b, idx]))  # [B, T(, V)], [B, T, H]

    def keep(self, idx):
        gone = set(range(len(self.salt))) - set(idx)
        for b in gone:
            if hasattr(self.ex, "release_salt"):
                self.ex.release_salt(self.salt[b])
        self.salt = [self.salt[i] for i in idx]
        self.seq = [self.seq[i] for i in idx]
        self.committed = [self.committed[i] for i in idx]
        self.ran = [self.ran[i] for i in idx]


def _error_line(message: str) -> str:
    """What a request's client is told of its error response: the first line. Upstream's text is
    the exception's message with its file and line, then a C++ backtrace (cpp/tensorrt_llm/common/
    tllmException.cpp): the whole of it goes to the server's log."""
    first, _, rest = message.partition("\n")
    if rest:
        print(f"target engine request failed: {message}", file=sys.stderr, flush=True)
    return f"target engine request failed: {first}"


def _partly(failed: dict[int, str], result: tuple) -> tuple:
    """A pass's result, or, when some of its rows failed, RowsFailed carrying it: one request's
    error response ends that request alone (reference/runners.py RowsFailed)."""
    if failed:
        raise RowsFailed(failed, result)
    return result


class EngineDrafter:
    """DrafterRunner: the drafter network (runtime/networks.py) on torch, over an Arena."""

    def __init__(self, weights: dict[str, torch.Tensor], spec: DrafterSpec, rope: Rope, *, block_size: int,
                 mask_token_id: int, target_layer_ids: tuple[int, ...], max_len: int, comm=SingleRank()):
        self.w, self.spec, self.rope, self.comm = weights, spec, rope, comm
        self.block_size, self.mask_token_id, self.target_layer_ids = block_size, mask_token_id, target_layer_ids
        emb = weights["transformer.vocab_embedding.weight"]
        self.arena = Arena(spec.num_layers, spec.num_kv_heads, spec.head_dim, max_len, emb.dtype, emb.device)

    def join(self, n):
        self.arena.join(n)

    @torch.inference_mode()
    def draft(self, anchor, start, ctx, ctx_pos, T):
        new = (ctx_pos != PAD).sum(1).to(torch.int32)  # valid rows are a prefix of each row
        if not torch.equal(self.arena.lens + new, start.to(torch.int32)):
            raise RuntimeError("drafter context is not contiguous with the anchor position")
        block = torch.full((anchor.shape[0], T), self.mask_token_id, dtype=torch.long, device=anchor.device)
        block[:, 0] = anchor
        blk_pos = start[:, None] + torch.arange(T, device=anchor.device)
        ops = TorchOps(self.w, self.rope, self.arena, new, self.comm)
        logits = drafter_forward(ops, self.spec, block, blk_pos, ctx, ctx_pos.clamp(min=0))
        self.arena.lens = self.arena.lens + new
        return logits

    def keep(self, idx):
        self.arena.keep(idx)


class Rank0Drafter:
    """The DrafterRunner of one tensor-parallel rank when rank 0 holds the whole drafter
    (placement rank0, docs/engine-tp.md), where every rank runs the round loop in step
    (sharded.ShardedModel, the CPU emulation): rank 0 drafts with `inner`, and every
    rank takes rank 0's draft logits [B, T-1, V] (a broadcast over `comm`), so all decoders
    verify the same drafts. In a deployment ranks > 0 run no loop: the drafts reach their target
    shards inside the verify requests the Executor's leader broadcasts."""

    def __init__(self, inner, comm, cfg, vocab_size: int, dtype: torch.dtype):
        if (inner is None) != (comm.rank != 0):
            raise ValueError(f"rank {comm.rank}: rank 0, and only rank 0, holds the drafter")
        self.inner, self.comm, self.vocab_size, self.dtype = inner, comm, vocab_size, dtype
        # What the round loop reads of every DrafterRunner (reference/runners.py), from the drafter config.
        self.block_size, self.mask_token_id = cfg.block_size, cfg.mask_token_id
        self.target_layer_ids = tuple(cfg.target_layer_ids)

    def join(self, n):
        if self.inner is not None:
            self.inner.join(n)

    def keep(self, idx):
        if self.inner is not None:
            self.inner.keep(idx)

    def draft(self, anchor, start, ctx, ctx_pos, T):
        if self.inner is not None:
            logits = self.inner.draft(anchor, start, ctx, ctx_pos, T).contiguous()
        else:
            logits = torch.empty(anchor.shape[0], T - 1, self.vocab_size, dtype=self.dtype, device=anchor.device)
        return self.comm.broadcast(logits)


class EngineModel:
    """Engine runners for the serving batcher: one executor and one drafter weight set shared by
    the decoders of every sampling group. With tp > 1 this is one rank's model (its shards and
    `comm`), driven by sharded.ShardedModel like the reference runners."""

    # A rank of it that dies takes the whole ShardedModel down (that model's `failed`); this one's
    # says when its Executor is broken for good (ExecutorHealth).

    @property
    def failed(self) -> str | None:
        return self.health.failed

    def __init__(self, executor, drafter_weights: dict | None, drafter_cfg, *, vocab_size: int,
                 eos_token_ids: tuple[int, ...], device: str = "cpu", comm=SingleRank(), drafter_factory=None,
                 rank0_of=None, draft_dtype: torch.dtype | None = None, health: ExecutorHealth | None = None):
        # drafter_factory(max_len) -> DrafterRunner replaces EngineDrafter over drafter_weights (the
        # drafter engine's runner, runtime/trt_runners.py); None: the torch drafter network.
        # rank0_of: the tensor-parallel group whose rank 0 alone holds the whole drafter (drafter_weights
        # there, None elsewhere; drafts in draft_dtype); `comm` is then the drafter's own (world 1).
        self.executor, self.w, self.cfg, self.comm = executor, drafter_weights, drafter_cfg, comm
        self.health = health or ExecutorHealth()  # one Executor, shared by every decoder's target runner
        self.drafter_factory, self.rank0_of, self.draft_dtype = drafter_factory, rank0_of, draft_dtype
        self._drafters: dict[int, object] = {}  # id(decoder) -> its drafter, until release
        self.vocab_size, self.eos_token_ids, self.device = vocab_size, eos_token_ids, device
        heads = Heads(drafter_cfg.num_heads, drafter_cfg.num_kv_heads, drafter_cfg.head_dim).local(comm.world)
        self.spec = dataclasses.replace(DrafterSpec.from_config(drafter_cfg), num_heads=heads.num_heads,
                                        num_kv_heads=heads.num_kv_heads)  # this rank's heads
        # The torch drafter network's RoPE table (a drafter engine has its own).
        self.rope = Rope(drafter_cfg.rope, drafter_cfg.head_dim).to(device) if drafter_factory is None else None

    @property
    def capabilities(self) -> Capabilities:
        """Full logits only where the Executor registered dflash_logits (TrtExecutor / FakeExecutor .registered)."""
        return of_outputs(self.executor.registered)

    def decoder(self, *, sampling, mode: str = "dflash", block_size: int | None = None,
                ddtree_budget: int | None = None,
                max_len: int = 2048) -> Decoder:
        block = block_size or self.cfg.block_size
        target = EngineTarget(self.executor, vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids,
                              tail=self.cfg.block_size, greedy=sampling.greedy, device=self.device,
                              health=self.health)
        if self.drafter_factory is not None:
            drafter = self.drafter_factory(max_len + 1 + block)
        elif self.w is not None:
            drafter = EngineDrafter(self.w, self.spec, self.rope, block_size=self.cfg.block_size,
                                    mask_token_id=self.cfg.mask_token_id, target_layer_ids=self.cfg.target_layer_ids,
                                    max_len=max_len + 1 + block, comm=self.comm)
        else:
            drafter = None
        if self.rank0_of is not None:
            drafter = Rank0Drafter(drafter, self.rank0_of, self.cfg, self.vocab_size, self.draft_dtype)
        decoder = Decoder(target, drafter, mode, block_size, ddtree_budget, sampling, max_len)
        self._drafters[id(decoder)] = drafter
        return decoder

    def release(self, decoder: Decoder) -> None:
        """A decoder is done: a factory that tracks its drafters (drafter_ranks.SplitDrafters:
        the other ranks hold a twin of each) hears of it."""
        drafter = self._drafters.pop(id(decoder), None)
        if drafter is not None and hasattr(self.drafter_factory, "release"):
            self.drafter_factory.release(drafter)

    def close(self) -> None:
        if hasattr(self.drafter_factory, "stop"):  # the worker ranks' drafter loops end
            self.drafter_factory.stop()
        if self.health.stuck:  # shutdown() joins the execution thread, which waits in the stuck step for good
            print("the target Executor is stuck in a step: left as it is (the process's end frees it)",
                  file=sys.stderr, flush=True)
            return
        self.executor.shutdown()


def drafter_weights(target: Target, drafter) -> dict[str, torch.Tensor]:
    """A reference pair's drafter under the engine checkpoint's names (tp 1), built with the
    convert stage's own map (formats/weight_maps.py DRAFTER_MAP) from the modules' tensors."""
    from trtllm_dflash.formats.weight_maps import DRAFTER_MAP, combine, model_entries, source_name

    sources = dict(drafter.state_dict())
    sources.update({"model.embed_tokens.weight": target.embed_tokens.weight, "lm_head.weight": target.lm_head.weight})
    out = {}
    for entry, layer in model_entries(DRAFTER_MAP, drafter.cfg, drafter=True):
        name = entry.dst.replace("{}", str(layer)) if layer is not None else entry.dst
        out[name] = combine(entry, [[sources[source_name(s, layer)] for s in entry.src]])
    return out


def engine_model_from_pair(target: Target, drafter, max_seq_len: int, registered: tuple[str, ...] | None = None
                           ) -> EngineModel:
    """The CPU engine runners over an in-memory reference pair (tests, benchmarks). `registered`:
    the Executor's additional outputs (default the deployments', which leave out dflash_logits;
    ENGINE_OUTPUTS for runners that can sample)."""
    d = drafter.cfg
    weights = drafter_weights(target, drafter)
    tap = {k: weights[k] for k in TAP_WEIGHTS}
    engine = TapEngine(target, tap, tuple(d.target_layer_ids), d.rms_norm_eps, tail=d.block_size)
    executor = FakeExecutor(engine, max_seq_len=max_seq_len + d.block_size, max_input_len=max_seq_len + d.block_size,
                            **({} if registered is None else {"registered": tuple(registered)}))
    return EngineModel(executor, weights, d, vocab_size=target.cfg.vocab_size, eos_token_ids=target.cfg.eos_token_ids,
                       device=str(target.device))
