"""Benchmarks only (decode, quantized pairs, the KV-injection kernel, HF baselines, soak); ships as trtllm_dflash.perf."""
