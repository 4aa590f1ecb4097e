"""Checkpoint conversion: per-architecture weight maps (formats/weight_maps.py), streaming reads and
writes (safetensors_stream.py) and the `convert` stage (convert.py)."""
