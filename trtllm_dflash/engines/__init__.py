"""The `build` stage: TensorRT-LLM 1.2.x engines for the engine backend.

upstream.py       the BuildConfig / PluginConfig fields, SpeculativeDecodingMode values and the
                  container, as data (read from TensorRT-LLM's builder.py, plugin/plugin.py,
                  commands/build.py)
plan.py           per engine (target, drafter): build_config.json, the stock trtllm-build
                  command, plugins and I/O tensors, from the recipe (pure, CPU)
build_config.py   the plan's build_config.json, plugins, attention features and KV cache dtype
interfaces.py     the plan's I/O tensors of each engine
stage.py          `trtllm-dflash build`: checks the --from checkpoints, writes the plan atomically
                  with a manifest, runs trtllm-build where TensorRT-LLM 1.2.x is installed
ops_trtllm.py     runtime/networks.py's op set on TensorRT-LLM (GPU-only; runtime/ops_torch.py
                  is the torch one); the engines' I/O contract is formats/engine_io.py
trtllm_models.py  the model classes trtllm-build loads (--model_cls_file): DFlashQwen3Target,
                  DFlashLlamaTarget, DFlashDrafter (GPU-only; imported by trtllm-build, not here)
"""
