"""Serving: the front ends (the Triton Python models triton_model.py and dialect_model.py, the
OpenAI server openai.py with its request bodies openai_bodies.py and semantics openai_service.py,
request parsing requests.py and dialect.py, whose tables are dialect_inputs.py and
dialect_outputs.py) over the in-flight batcher (batcher.py) of a deployed model (deployed.py),
with its metrics, traces and acceptance checks. What decodes lives in runtime/, what starts the
servers in launch/."""
