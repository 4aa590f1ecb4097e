"""GPU tests: everything here needs CUDA and is skipped (with the reason) without it.

Every module here sets `pytestmark = pytest.mark.gpu` (tests/conftest.py skips that marker
without CUDA). docs/gpu.md gives the one command that runs them all on a lent GPU machine
(tests/gpu/run_all.sh) and what each file checks:

  test_gpu_kernel_op.py          the CUDA op dispatches to the Triton kernel
  test_gpu_kernels_qwen3_8b.py   attention and append kernels at Qwen3-8B drafter shapes, bf16 / FP8 cache
  test_gpu_aot_launch.py         the AOT plugins' PTX launched with TensorRT's argument list (+ padding)
  test_gpu_kernel_bandwidth.py   achieved HBM bandwidth (perf/bench_kv_inject.py), floor 25% of peak
  test_gpu_reference.py          the reference backend on CUDA stays lossless
  test_gpu_checklist.py          engine-path.md §10 (items 1-4 need TensorRT-LLM 1.2.x: the container)

The KV-injection problem generator lives beside the CPU kernel tests
(tests/helpers/kv_inject_cases.py); the AOT launch helpers in tests/helpers/aot_launch.py.
"""
