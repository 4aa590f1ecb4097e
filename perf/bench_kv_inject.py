"""GPU benchmark of the KV-injection attention kernel: achieved bandwidth against HBM peak.

The drafter's attention reads the whole context K/V cache once per KV head for a block of
~16 queries, so it is memory-bound: the figure of merit is bytes moved / time against the
hardware's HBM bandwidth (from the hardware catalog). The pure-torch reference on the same
tensors is timed alongside.

Usage (needs a CUDA GPU and triton; without them it prints why and exits 0):
    python -m trtllm_dflash.perf.bench_kv_inject --hardware h100-sxm --batch 1 8 32 \\
        --cache-len 1024 4096 16384 [--dtype bf16] [--fp8-cache] [--window 2048] [--causal-block]

One line per (batch, cache length); the last stdout line is JSON with every row.
"""

import argparse
import json
import sys
from typing import Optional

from trtllm_dflash.errors import UserError

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1}


def bytes_moved(batch: int, cache_len: int, block_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                dtype: str, cache_dtype: str, window: Optional[int] = None) -> int:
    """Minimum HBM traffic of one call: visible cache K and V, q / k_block / v_block read, out written."""
    visible = cache_len if window is None else min(cache_len, window + block_len - 1)
    cache = 2 * batch * visible * num_kv_heads * head_dim * BYTES[cache_dtype]
    block = batch * block_len * (2 * num_q_heads + 2 * num_kv_heads) * head_dim * BYTES[dtype]
    return cache + block + batch * 4  # + cache_lens


def hbm_bandwidth_gbs(hardware: str) -> float:
    """Peak HBM bandwidth in GB/s of a catalog entry."""
    from trtllm_dflash.recipe.hardware import hardware_catalog

    catalog = hardware_catalog()
    if hardware not in catalog:
        raise UserError(f"--hardware {hardware!r} is not in the hardware catalog; choose one of {', '.join(catalog)}")
    tbs = catalog[hardware].hbm_bandwidth_tbs
    if tbs is None:
        raise UserError(f"--hardware {hardware!r} has no HBM bandwidth in the catalog (it is not a GPU)")
    return tbs * 1000.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hardware", default="h100-sxm", help="hardware catalog entry whose HBM bandwidth is the peak")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--cache-len", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--block-len", type=int, default=16)
    p.add_argument("--num-q-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--fp8-cache", action="store_true", help="float8_e4m3fn context cache with per-head scales")
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--causal-block", action="store_true")
    p.add_argument("--no-reference", action="store_true", help="skip timing the torch reference")
    return p.parse_args(argv)


def unavailable_reason() -> Optional[str]:
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "needs triton (pip install 'trtllm_dflash[kernels]')"
    return None


def run(args: argparse.Namespace, device: str = "cuda", bench=None) -> list:
    """Time every (batch, cache length); `bench(fn) -> ms` defaults to triton.testing.do_bench."""
    import torch

    if bench is None:
        from triton.testing import do_bench as bench

    from trtllm_dflash.plugins.kv_inject_attention import kv_inject_attention_reference
    from trtllm_dflash.plugins.kv_inject_attention.kernel import kv_inject_attention_triton

    peak = hbm_bandwidth_gbs(args.hardware)
    dtype = getattr(torch, DTYPES[args.dtype])
    cache_dtype = torch.float8_e4m3fn if args.fp8_cache else dtype
    Hq, Hkv, D, T = args.num_q_heads, args.num_kv_heads, args.head_dim, args.block_len
    rows = []
    name = torch.cuda.get_device_name() if device == "cuda" else device
    print(f"kv_inject_attention on {name} vs {args.hardware} HBM {peak:.0f} GB/s | "
          f"T={T} Hq={Hq} Hkv={Hkv} D={D} {args.dtype} cache={'fp8' if args.fp8_cache else args.dtype} "
          f"window={args.window} causal_block={args.causal_block}")
    print(f"{'batch':>6} {'cache':>7} {'kernel us':>10} {'GB/s':>8} {'% HBM':>6} {'torch us':>10} {'speed-up':>8}")
    for batch in args.batch:
        for cache_len in args.cache_len:
            dev = device
            q = torch.randn(batch, T, Hq, D, device=dev, dtype=dtype)
            k_block, v_block = (torch.randn(batch, T, Hkv, D, device=dev, dtype=dtype) for _ in range(2))
            k_cache, v_cache = (torch.randn(batch, cache_len, Hkv, D, device=dev).to(cache_dtype) for _ in range(2))
            lens = torch.full((batch,), cache_len, dtype=torch.int32, device=dev)
            scales = {}
            if args.fp8_cache:
                scales = dict(k_scale=torch.ones(Hkv, device=dev), v_scale=torch.ones(Hkv, device=dev))
            options = dict(causal_block=args.causal_block, window=args.window, **scales)
            out = torch.empty_like(q)
            kernel_ms = bench(lambda: kv_inject_attention_triton(q, k_block, v_block, k_cache, v_cache, lens,
                                                                    out=out, **options))
            torch_ms = None
            if not args.no_reference:
                torch_ms = bench(lambda: kv_inject_attention_reference(q, k_block, v_block, k_cache, v_cache, lens,
                                                                          **options))
            nbytes = bytes_moved(batch, cache_len, T, Hq, Hkv, D, DTYPES[args.dtype],
                                 "float8_e4m3fn" if args.fp8_cache else DTYPES[args.dtype], args.window)
            gbs = nbytes / (kernel_ms * 1e-3) / 1e9
            row = dict(batch=batch, cache_len=cache_len, bytes=nbytes, kernel_us=kernel_ms * 1e3, gbs=gbs,
                       hbm_fraction=gbs / peak, torch_us=None if torch_ms is None else torch_ms * 1e3)
            rows.append(row)
            ref = "-" if torch_ms is None else f"{torch_ms * 1e3:10.1f} {torch_ms / kernel_ms:7.1f}x"
            print(f"{batch:>6} {cache_len:>7} {kernel_ms * 1e3:>10.1f} {gbs:>8.0f} {100 * gbs / peak:>5.1f}% {ref}")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        peak = hbm_bandwidth_gbs(args.hardware)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason is not None:
        print(f"bench_kv_inject: skipped: {reason}")
        print(json.dumps({"bench": "kv_inject_attention", "skipped": reason, "hardware": args.hardware,
                          "hbm_gbs": peak}))
        return 0
    rows = run(args)
    print(json.dumps({"bench": "kv_inject_attention", "hardware": args.hardware, "hbm_gbs": peak, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
