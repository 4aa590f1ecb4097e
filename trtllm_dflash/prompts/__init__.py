"""Prompt sources: the offline stdlib corpus (corpus.py) and the token / text prompts cut from it
(sources.py), shared by training, benchmarks and sweeps."""
