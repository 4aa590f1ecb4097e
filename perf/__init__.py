"""Benchmarks, serving metrics, sweeps and plots (ships as trtllm_dflash.perf)."""
