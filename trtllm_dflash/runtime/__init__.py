"""Runtimes over stage outputs: tensor-parallel reference runs of converted / quantized checkpoints (tp.py)."""
