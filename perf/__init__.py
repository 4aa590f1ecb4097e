"""Benchmarks only (decode, quantized pairs, the KV-injection kernel, HF baselines, soak, draft-length
policies served, in process and replayed); ships as trtllm_dflash.perf."""
