"""Projections: what a recipe will deliver on H100 / H200 / B200 / B300 before anyone books the
machines, from a step-time model (stepmodel.py: bytes and FLOPs per decoding step against the
catalog's bandwidth and tensor rates, all-reduce, launch and scheduling costs) and an acceptance
profile (acceptance.py: measured by the reference backend, or published). projection.py turns
them into the sweep's curves and headline ratios (sweep/fronts.py); report.py writes the table,
JSON and plot; calibrate.py measures the cpu "GPU".

A consumer like sweep: it reads recipe/, reference/, prompts/ and sweep/; no stage imports it.
"""
