"""What decodes a deployment, shared by serve/ (the loop) and engines/ (the same networks on
TensorRT-LLM):

checkpoint.py       a convert / quantize output read into reference modules, one rank's shard
tp_layers.py        the tensor-parallel collectives and layers those modules run with
sharded.py          one model over `tp` worker processes (torch.distributed)
checkpoint_runner.py  `open_checkpoint` / `checkpoint_steps`: a checkpoint ready to decode
rank_model.py       one rank's model over its shard (reference or engine runners), for both
local_model.py      a reference target and drafter in this process
networks.py         the drafter network and the target tap, written once over an op set;
                    ops_torch.py runs them on torch (engines/ops_trtllm.py on TensorRT-LLM)
engine_runners.py   the engine backend's runners: the round loop over TensorRT-LLM engines or
                    their CPU stand-ins (fake_executor.py: the C++ Executor on torch)
drafter_runner.py   the drafter engine's runner, which owns its context arena
drafter_ranks.py    a drafter split over the tensor-parallel ranks of a leader-mode deployment
trt_runners.py      the TensorRT sessions and Executor behind them (GPU-only imports, inside functions)
"""

RUNNERS = ("reference", "emulated", "tensorrt")  # what decodes: our torch modules, the engine stand-ins, TensorRT
CPU_RUNNERS = RUNNERS[:2]  # those that decode on this machine (our torch modules; the engine stand-ins)
