"""The layouts several stages read and write, so that no stage imports another for them:

weight_maps.py    HF / z-lab tensor names -> TensorRT-LLM checkpoint names and per-rank splits
                  (convert writes them; the runtime reads them back; build's model classes load them)
quant.py          the FP8 and NVFP4 weight formats, quantize and dequantize (quantize writes them;
                  the runtime and the target engine's tap dequantize them)
engine_io.py      the engines' I/O contract (names, dims, the tail-row rule, tap weights, the
                  executor's output names) shared by the build plan, the model classes and the runners
"""
