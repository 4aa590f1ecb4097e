"""What the step model (stepmodel.py) returns: a PassCost per forward pass on one rank (bytes,
FLOPs and the time of each part), and a StepCost per decoding step or round with the metrics a
sweep measures (tokens/s/user, TTFT, E2E, tokens/s/GPU; stepmodel.py's docstring, "Metrics")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassCost:
    """One forward pass on one rank: what it moves and computes, and the time of each part [s]."""

    weight_bytes: float
    kv_bytes: float
    gemm_flops: float
    attention_flops: float
    t_weights: float
    t_gemm: float
    t_attention: float
    t_allreduce: float
    t_layers: float

    @property
    def seconds(self) -> float:
        return self.t_weights + self.t_gemm + self.t_attention + self.t_allreduce + self.t_layers

    def __add__(self, other: PassCost) -> PassCost:
        return PassCost(*(getattr(self, f) + getattr(other, f) for f in PassCost.__dataclass_fields__))


ZERO = PassCost(0, 0, 0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class StepCost:
    """One decoding step (AR) or round (DFlash) of `concurrency` sequences."""

    concurrency: int
    draft_len: int  # 0 = AR
    tau: float  # tokens committed per step per sequence
    target: PassCost
    drafter: PassCost
    t_overhead: float  # fixed step + per-sequence costs
    t_prefill_share: float  # the prompt passes of new requests, per step
    t_prefill: float  # one request's prompt pass, with its launch
    output_len: int = 0  # tokens per request (0: a steady decode, no request boundaries)

    @property
    def seconds(self) -> float:
        return self.target.seconds + self.drafter.seconds + self.t_overhead + self.t_prefill_share

    @property
    def tok_s_user(self) -> float:
        return self.tau / self.seconds

    @property
    def ttft(self) -> float:
        """A new request's prompt pass, after the step in progress when there is one (c > 1)."""
        return self.t_prefill + (self.seconds if self.concurrency > 1 else 0.0)

    @property
    def e2e(self) -> float:
        return self.ttft + max(0, self.output_len - 1) * self.seconds / self.tau

    def tok_s_gpu(self, gpus: int) -> float:
        """Output tokens/s per GPU: every one of c request slots delivers output_len tokens per
        request lifetime (E2E, the first token's wait included), as a closed-loop sweep measures;
        c * tau / T without request boundaries."""
        if self.output_len > 0:
            return self.concurrency * self.output_len / self.e2e / gpus
        return self.concurrency * self.tau / self.seconds / gpus

    def breakdown_ms(self) -> dict:
        t, d = self.target, self.drafter
        return {
            "step_ms": self.seconds * 1e3,
            "target_weights_ms": t.t_weights * 1e3, "target_gemm_ms": t.t_gemm * 1e3,
            "target_attention_ms": t.t_attention * 1e3, "target_allreduce_ms": t.t_allreduce * 1e3,
            "target_layers_ms": t.t_layers * 1e3, "drafter_ms": d.seconds * 1e3,
            "overhead_ms": self.t_overhead * 1e3, "prefill_share_ms": self.t_prefill_share * 1e3,
            "bytes_read": t.weight_bytes + t.kv_bytes + d.weight_bytes + d.kv_bytes,
            "weight_bytes": t.weight_bytes + d.weight_bytes, "kv_bytes": t.kv_bytes, "drafter_ctx_bytes": d.kv_bytes,
            "verify_flops": t.gemm_flops + t.attention_flops, "drafter_flops": d.gemm_flops + d.attention_flops,
        }
