"""Whether the engine backend's target Executor can still serve: a failed step is usually one bad
minute (the Executor serves on), a broken device or a step that never ends is for good; then the
model reports that it cannot serve, and a restart is the remedy (docs/serving.md)."""

from __future__ import annotations

import time

import torch

from trtllm_dflash.runtime.fake_executor import STEP_FAILED

# Steps failed in a row with none served between, over at least FATAL_SECONDS, after which the
# Executor is taken as broken though its device answers. Steps fail on healthy GPUs too (KV
# block-reuse assertions under load: NVIDIA/TensorRT-LLM#2708, #13123), and a client that retries
# a failed request (the OpenAI SDK retries a 500 twice) repeats its failure within seconds.
FATAL_STEPS, FATAL_SECONDS = 3, 60.0
# How long a request may go unanswered before the Executor is taken as hung. At tp > 1 a step that
# throws on one rank alone leaves the others in that step's all-reduce for good, and 1.2.1's
# await_responses waits without end unless given a timeout; a step of ours takes seconds at most.
HUNG_SECONDS = 300.0
CANNOT_SERVE = "this model cannot serve any more requests; restart the server"


class ExecutorHealth:
    """Whether the target Executor can still serve. 1.2.1 answers a step that threw with the same
    error to every request it held and goes on (fake_executor.STEP_FAILED). After such a step
    `probe` asks the device (a small CUDA op on its GPU: a sticky CUDA error, such as an illegal
    memory access, fails every later call in the process): if it fails, or if steps have failed
    for FATAL_STEPS in a row over FATAL_SECONDS with none served between, `failed` says so and
    the server reports that it cannot serve (health checks fail; a restart is the remedy), as for
    a dead rank; so too when a request goes unanswered for hung_s (`hung`). probe None: no device
    to ask (the CPU stand-ins)."""

    def __init__(self, probe=None, clock=time.monotonic, hung_s: float = HUNG_SECONDS) -> None:
        self.failed: str | None = None
        self.stuck = False  # a request went unanswered for hung_s: the Executor's step never ends
        self.probe, self.clock, self.hung_s = probe, clock, hung_s
        self.streak, self.since = 0, 0.0

    def saw(self, errors: list[str | None]) -> None:
        """One pass's responses: per request its error message, None where it was served."""
        if any(e is None for e in errors):
            self.streak = 0
            return
        if self.failed is not None or not all(e.startswith(STEP_FAILED) for e in errors):
            return
        now = self.clock()
        if self.streak == 0:
            self.since = now
        self.streak += 1
        last = errors[0].splitlines()[0]
        broken = self._device_error()
        if broken is not None:
            self.failed = f"the target engine's step failed ({last}) and its GPU no longer answers ({broken}): " \
                          f"{CANNOT_SERVE}"
        elif self.streak >= FATAL_STEPS and now - self.since >= FATAL_SECONDS:
            self.failed = (f"the target engine failed {self.streak} steps in a row over {now - self.since:.0f} s with "
                           f"none served between (last: {last}): {CANNOT_SERVE}")

    def hung(self) -> str:
        """A request went unanswered for hung_s: the Executor is stuck in a step."""
        self.stuck = True
        self.failed = self.failed or (f"the target engine answered no request for {self.hung_s:g} s (a step that "
                                      f"never ends: at tp > 1, a rank whose step failed alone): {CANNOT_SERVE}")
        return self.failed

    def _device_error(self) -> str | None:
        if self.probe is None:
            return None
        try:
            self.probe()
        except Exception as e:  # the device's own error: what the server reports
            return str(e).splitlines()[0] if str(e) else type(e).__name__
        return None


def cuda_probe(device: str):
    """ExecutorHealth's probe on `device`: a synchronize and a one-element op, which a sticky CUDA
    error in this process makes raise."""
    def probe() -> None:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    return probe
