"""The `sweep` stage: concurrency vs interactivity against a running server. The load
generator (loadgen.py, with the protocols it speaks in protocols.py), one definition of every
metric (metrics.py), and the table and Pareto plot (report.py)."""
