"""What decodes a deployment, shared by serve/ (the loop) and build/ (the same networks on
TensorRT-LLM):

checkpoint.py       a convert / quantize output read into reference modules, one rank's shard
tp_layers.py        the tensor-parallel collectives and layers those modules run with
sharded.py          one model over `tp` worker processes (torch.distributed)
checkpoint_runner.py  `open_checkpoint` / `checkpoint_steps`: a checkpoint ready to decode
local_model.py      a reference target and drafter in this process
networks.py         the drafter network and the target tap, written once over an op set;
                    ops_torch.py runs them on torch (build/ops_trtllm.py on TensorRT-LLM)
engine_runners.py   the engine backend's runners (target Executor + drafter), emulated on CPU
fake_executor.py    the CPU stand-in of TensorRT-LLM's C++ Executor
drafter_runner.py   the drafter engine's runner (its context arena)
drafter_ranks.py    drafter ranks beside a tensor-parallel target
trt_runners.py      the same runners over real TensorRT-LLM engines (GPU)
"""

RUNNERS = ("reference", "emulated", "tensorrt")  # what decodes: our torch modules, the engine stand-ins, TensorRT
CPU_RUNNERS = RUNNERS[:2]  # those that decode on this machine (our torch modules; the engine stand-ins)
