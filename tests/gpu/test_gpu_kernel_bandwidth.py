"""The attention kernel's achieved HBM bandwidth at Qwen3-8B drafter shapes (perf/bench_kv_inject.py's
measurement: bytes it must move / time, against the hardware catalog's peak). The floor is loose
(a broken or badly tiled kernel lands far below it); the numbers go to $OUT when it is set
(docs/gpu.md) and are what docs/results/gpu-runs.md records."""

import argparse
import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

# torch.cuda.get_device_name() -> hardware catalog entry (recipe/catalog/hardware.yaml)
CATALOG = {"H100": "h100-sxm", "H200": "h200", "B200": "b200", "B300": "b300"}
FLOOR = 0.25  # of catalog peak, at the largest problem


def _hardware() -> str | None:
    name = torch.cuda.get_device_name()
    return next((entry for key, entry in CATALOG.items() if key in name), None)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_kernel_bandwidth_at_qwen3_8b_drafter_shapes(fp8, record_property):
    from trtllm_dflash.perf import bench_kv_inject

    hardware = _hardware()
    if hardware is None:
        pytest.skip(f"no hardware catalog entry for {torch.cuda.get_device_name()}")
    args = argparse.Namespace(hardware=hardware, batch=[1, 8, 32], cache_len=[4096, 16384], block_len=16,
                              num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16", fp8_cache=fp8, window=None,
                              causal_block=False, no_reference=True)
    rows = bench_kv_inject.run(args)
    best = max(rows, key=lambda r: r["bytes"])
    record_property("hbm_fraction_largest", round(best["hbm_fraction"], 3))
    out = os.environ.get("OUT")
    if out:
        name = f"bench_kv_inject_{'fp8' if fp8 else 'bf16'}.json"
        (Path(out) / name).write_text(json.dumps({"hardware": hardware, "device": torch.cuda.get_device_name(),
                                                  "rows": rows}, indent=1))
    assert best["hbm_fraction"] >= FLOOR, (f"{best['gbs']:.0f} GB/s = {best['hbm_fraction']:.1%} of {hardware}'s HBM "
                                           f"peak at batch {best['batch']} x {best['cache_len']} (floor {FLOOR:.0%})")
