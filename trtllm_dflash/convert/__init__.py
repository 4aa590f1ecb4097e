"""Checkpoint conversion: per-architecture weight maps (formats/weight_maps.py), streaming reads and
writes (safetensors_stream.py), the checked inputs (sources.py), each rank's plan (shard_plan.py), the
config.json files (configs.py) and the `convert` stage's work (convert.py)."""
