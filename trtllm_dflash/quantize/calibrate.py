"""Max calibration of linear layers, in plain torch: the amax that every static scale comes from.

`collect_linear_amax` runs a model over calibration batches with a forward pre-hook on every
`nn.Linear` and keeps, per layer, the largest |input| seen and the largest |weight|. This is
what ModelOpt's `max` algorithm records (with quantization off during calibration), so the
scales derived from it equal ModelOpt's (tests/quantize/test_formats.py checks that).

Layers that share one input are fused into one GEMM by TensorRT-LLM (q/k/v; gate/up), which
then needs one input scale and, for NVFP4, one global weight scale: `shared_input_groups`
names those groups and `group_weight_amax` gives their common amax (the largest member's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

# Linear layers that read the same input, by the last component of their name.
SHARED_INPUT_SUFFIXES: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# The DFlash drafter's query projection sees only the block, its KV-injection k/v also the
# context: our drafter engine fuses k/v only (formats/weight_maps.py DRAFTER_MAP).
DRAFTER_SHARED_INPUT_SUFFIXES: tuple[tuple[str, ...], ...] = (("k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass
class LinearAmax:
    weight: torch.Tensor  # FP32 0-dim: max |W|
    input: torch.Tensor | None  # FP32 0-dim: max |x| over calibration; None when never called


def collect_linear_amax(
    model: nn.Module,
    batches: Iterable,
    run: Callable[[nn.Module, object], None] | None = None,
    on_batch: Callable[[], None] | None = None,
) -> dict[str, LinearAmax]:
    """Per `nn.Linear` (by module name): weight amax and the input amax over `batches`.

    `run(model, batch)` does one forward (default: `model(batch)`); `on_batch` is called after
    each batch (a progress bar's advance).
    """
    seen: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def pre(_module, args):
            a = args[0].detach().abs().amax().float().cpu()
            seen[name] = torch.maximum(seen[name], a) if name in seen else a

        return pre

    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears.items()]
    try:
        with torch.no_grad():
            for batch in batches:
                (run or (lambda mod, b: mod(b)))(model, batch)
                if on_batch is not None:
                    on_batch()
    finally:
        for h in handles:
            h.remove()
    return {
        n: LinearAmax(weight=m.weight.detach().abs().amax().float().cpu(), input=seen.get(n))
        for n, m in linears.items()
    }


def shared_input_groups(names: Iterable[str],
                        suffixes: tuple[tuple[str, ...], ...] = SHARED_INPUT_SUFFIXES) -> list[list[str]]:
    """Groups of layer names (same parent module) that TensorRT-LLM fuses into one GEMM."""
    names = list(names)
    present = set(names)
    groups, grouped = [], set()
    for name in names:
        parent, _, leaf = name.rpartition(".")
        for group in suffixes:
            if leaf == group[0]:
                members = [f"{parent}.{s}" if parent else s for s in group]
                members = [m for m in members if m in present]
                if len(members) > 1:
                    groups.append(members)
                    grouped.update(members)
    return groups + [[n] for n in names if n not in grouped]


def group_weight_amax(amax: dict[str, LinearAmax], group: list[str]) -> torch.Tensor:
    return torch.stack([amax[n].weight for n in group]).max()


def group_input_amax(amax: dict[str, LinearAmax], group: list[str]) -> torch.Tensor | None:
    values = [amax[n].input for n in group if amax[n].input is not None]
    return torch.stack(values).max() if values else None
