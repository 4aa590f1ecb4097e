"""The memory plan: what each rank of a recipe's deployment holds, whether it fits its GPU, and
where the processes and the drafter run.

planner.py      the door: a recipe's plan (rank 0's) and the smallest tp that fits each GPU
rows.py         what one rank holds: a row per component with its formula and allocation
fit.py          where each row is allocated, the least memory the rows need, the largest batch
drafter.py      where the drafter runs at tp > 1 (whole on rank 0 or split), the one rule
sharding.py     what tp must divide in each model, and what one rank then holds
engine_layout.py  what TensorRT-LLM 1.2.x makes of the engine backend's target engine
engine_memory.py  the engine backend's engine tensors beyond weights and caches
placement.py    nodes, processes and GPUs per node of a deployment
"""
