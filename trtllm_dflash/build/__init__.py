"""The `build` stage: TensorRT-LLM 1.2.x engines for the engine backend.

upstream.py       the BuildConfig / PluginConfig fields, SpeculativeDecodingMode values and the
                  container, as data (read from TensorRT-LLM's builder.py, plugin/plugin.py,
                  commands/build.py)
plan.py           per engine (target, drafter): build_config.json, the stock trtllm-build
                  command, plugins and I/O tensors, from the recipe (pure, CPU)
stage.py          `trtllm-dflash build`: checks the --from checkpoints, writes the plan atomically
                  with a manifest, runs trtllm-build where TensorRT-LLM 1.2.x is installed
engine_io.py      the engines' I/O contract (names, dims, the tail-row rule, tap weights, the
                  executor's output names) shared by the plan, the model classes and the runners
networks.py       the drafter network and the target tap, written once over an op set;
                  ops_torch.py runs them on torch (CPU), ops_trtllm.py on TensorRT-LLM (GPU-only)
trtllm_models.py  the model classes trtllm-build loads (--model_cls_file): DFlashQwen3Target,
                  DFlashLlamaTarget, DFlashDrafter (GPU-only; imported by trtllm-build, not here)
"""
