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

import torch

from trtllm_dflash.formats.engine_io import TAP_WEIGHTS
from trtllm_dflash.formats.weight_maps import Heads
from trtllm_dflash.reference.generate import Decoder
from trtllm_dflash.reference.runners import PAD, causal_mask
from trtllm_dflash.reference.target import Rope, Target
from trtllm_dflash.runtime.fake_executor import AdditionalModelOutput, FakeExecutor, OutputConfig, Request
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
        rows = (torch.arange(self.tail, device=dev)[None, :] + n - self.tail).clamp(min=0)  # [B, tail]: the last positions
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
                 greedy: bool, device: torch.device | str = "cpu"):
        self.ex, self.tail, self.greedy = executor, tail, greedy
        self.full_logits = False  # set by the decoder: a greedy decoder whose requests need the full logits
        self.vocab_size, self.eos_token_ids, self.device = vocab_size, eos_token_ids, torch.device(device)
        self.salt: list[int] = []
        self.committed: list[list[int]] = []  # tokens at positions [0, start) of every row
        self.last: list[list[int]] = []  # the tokens of the row's last verify (anchor + drafts)

    def _requests(self, inputs: list[list[int]], salts: list[int], names: list[tuple[str, bool]]) -> list[dict]:
        outputs = OutputConfig([AdditionalModelOutput(n, gather_context=g) for n, g in names])
        ids = [self.ex.enqueue_request(Request(list(inp), 1, outputs, cache_salt_id=s)) for inp, s in zip(inputs, salts)]
        results = []
        for rid in ids:
            (resp,) = self.ex.await_responses(rid)
            if resp.has_error():
                raise RuntimeError(f"target engine request failed: {resp.error_msg}")
            results.append({o.name: torch.as_tensor(o.output, device=self.device) for o in resp.result.additional_outputs})
        return results

    def _scores(self, out: dict, n: int) -> torch.Tensor:
        """The last n tail positions' logits [n, V]; greedy engines return one-hot argmax instead,
        unless the decoder asked for the full logits (bad words or log-probabilities)."""
        if not self._argmax_only:
            return out["dflash_logits"][-n:].float()
        return torch.nn.functional.one_hot(out["dflash_argmax"][-n:].long(), self.vocab_size).float()

    def _tail(self) -> list[tuple[str, bool]]:
        return [("dflash_tail", False), ("dflash_argmax" if self._argmax_only else "dflash_logits", False)]

    @property
    def _argmax_only(self) -> bool:
        return self.greedy and not self.full_logits

    def prefill(self, prompts):
        salts = [next(self._salts) for _ in prompts]
        outs = self._requests(prompts, salts, [("dflash_ctx", True), *self._tail()])
        P = max(len(p) for p in prompts)
        feats = torch.zeros(len(prompts), P, outs[0]["dflash_ctx"].shape[-1], dtype=outs[0]["dflash_ctx"].dtype,
                            device=self.device)
        for b, (p, out) in enumerate(zip(prompts, outs)):
            if out["dflash_ctx"].shape[0] != len(p):  # a reused prefix has no context rows (1.2.1 rule)
                raise RuntimeError(f"prefill returned {out['dflash_ctx'].shape[0]} context rows for a {len(p)}-token "
                                   "prompt: KV reuse hid some (the cache salt must be new)")
            feats[b, : len(p)] = out["dflash_ctx"]
        self.salt += salts
        self.committed += [list(p) for p in prompts]
        self.last += [[] for _ in prompts]
        return torch.stack([self._scores(out, 1)[0] for out in outs]), feats

    def verify(self, tokens, start, lengths=None):
        T = tokens.shape[1]
        if T > self.tail:
            raise RuntimeError(f"verify block of {T} tokens is longer than the engine's tail of {self.tail} rows")
        own = [T] * len(start) if lengths is None else [n + 1 for n in lengths.tolist()]  # tokens each row runs
        inputs = []
        for b, s in enumerate(start.tolist()):
            have = self.committed[b]
            have += self.last[b][: s - len(have)]  # the anchor and accepted drafts of the last round
            assert len(have) == s, f"row {b}: {len(have)} committed tokens for position {s}"
            self.last[b] = tokens[b, : own[b]].tolist()
            inputs.append(have + self.last[b])
        outs = self._requests(inputs, self.salt, self._tail())
        pad = lambda x, n: torch.nn.functional.pad(x, (0, 0, 0, T - n))  # noqa: E731  rows past a row's own: zeros
        logits = torch.stack([pad(self._scores(out, n), n) for out, n in zip(outs, own)])  # [B, T, V]
        feats = torch.stack([pad(out["dflash_tail"][-n:], n) for out, n in zip(outs, own)])  # [B, T, H]
        return logits, feats

    def keep(self, idx):
        gone = set(range(len(self.salt))) - set(idx)
        for b in gone:
            if hasattr(self.ex, "release_salt"):
                self.ex.release_salt(self.salt[b])
        self.salt = [self.salt[i] for i in idx]
        self.committed = [self.committed[i] for i in idx]
        self.last = [self.last[i] for i in idx]


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

    failed = None  # a single process: a rank of it that dies takes the whole ShardedModel down

    def __init__(self, executor, drafter_weights: dict | None, drafter_cfg, *, vocab_size: int,
                 eos_token_ids: tuple[int, ...], device: str = "cpu", comm=SingleRank(), drafter_factory=None,
                 rank0_of=None, draft_dtype: torch.dtype | None = None):
        # drafter_factory(max_len) -> DrafterRunner replaces EngineDrafter over drafter_weights (the
        # drafter engine's runner, runtime/trt_runners.py); None: the torch drafter network.
        # rank0_of: the tensor-parallel group whose rank 0 alone holds the whole drafter (drafter_weights
        # there, None elsewhere; drafts in draft_dtype); `comm` is then the drafter's own (world 1).
        self.executor, self.w, self.cfg, self.comm = executor, drafter_weights, drafter_cfg, comm
        self.drafter_factory, self.rank0_of, self.draft_dtype = drafter_factory, rank0_of, draft_dtype
        self._drafters: dict[int, object] = {}  # id(decoder) -> its drafter, until release
        self.vocab_size, self.eos_token_ids, self.device = vocab_size, eos_token_ids, device
        heads = Heads(drafter_cfg.num_heads, drafter_cfg.num_kv_heads, drafter_cfg.head_dim).local(comm.world)
        self.spec = dataclasses.replace(DrafterSpec.from_config(drafter_cfg), num_heads=heads.num_heads,
                                        num_kv_heads=heads.num_kv_heads)  # this rank's heads
        # The torch drafter network's RoPE table (a drafter engine has its own).
        self.rope = Rope(drafter_cfg.rope, drafter_cfg.head_dim).to(device) if drafter_factory is None else None

    def decoder(self, *, sampling, mode: str = "dflash", block_size: int | None = None, ddtree_budget: int | None = None,
                max_len: int = 2048) -> Decoder:
        block = block_size or self.cfg.block_size
        target = EngineTarget(self.executor, vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids,
                              tail=self.cfg.block_size, greedy=sampling.greedy, device=self.device)
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


def engine_model_from_pair(target: Target, drafter, max_seq_len: int) -> EngineModel:
    """The CPU engine runners over an in-memory reference pair (tests, benchmarks)."""
    d = drafter.cfg
    weights = drafter_weights(target, drafter)
    tap = {k: weights[k] for k in TAP_WEIGHTS}
    engine = TapEngine(target, tap, tuple(d.target_layer_ids), d.rms_norm_eps, tail=d.block_size)
    executor = FakeExecutor(engine, max_seq_len=max_seq_len + d.block_size, max_input_len=max_seq_len + d.block_size)
    return EngineModel(executor, weights, d, vocab_size=target.cfg.vocab_size, eos_token_ids=target.cfg.eos_token_ids,
                       device=str(target.device))
