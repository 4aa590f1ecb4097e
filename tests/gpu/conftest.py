"""GPU tests: everything here needs CUDA and is skipped (with the reason) without it.

Every module here sets `pytestmark = pytest.mark.gpu` (tests/conftest.py skips that marker
without CUDA). docs/gpu.md gives the one command that runs them all on a lent GPU machine
(tests/gpu/run_all.sh) and what each file checks:

  test_gpu_kernel_op.py          the CUDA op dispatches to the Triton kernel
  test_gpu_kernels_qwen3_8b.py   attention and append kernels at Qwen3-8B drafter shapes, bf16 / FP8 cache
  test_gpu_aot_launch.py         the AOT plugins' PTX launched with TensorRT's argument list (+ padding)
  test_gpu_kernel_bandwidth.py   achieved HBM bandwidth (perf/bench_kv_inject.py), floor 25% of peak
  test_gpu_reference.py          the reference backend on CUDA stays lossless
  test_gpu_checklist.py          docs/design/engine-path.md, first-GPU checklist (items 1-4 need
                                 TensorRT-LLM 1.2.x: the container)

The KV-injection problem generator lives beside the CPU kernel tests
(tests/helpers/kv_inject_cases.py); the AOT launch helpers in tests/helpers/aot_launch.py.
"""


import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """(checkpoint info, convert output, build output) of the checklist's tiny engine recipe with its
    engines built (tests/helpers/checklist.py), once per session."""
    from checklist import checklist_recipe, record
    from trtllm_dflash.convert.convert import convert
    from trtllm_dflash.engines.stage import build
    from trtllm_dflash.runtime.checkpoint import read_checkpoint

    root = tmp_path_factory.mktemp("engines")
    recipe = checklist_recipe()
    conv = convert(recipe, root / "convert", progress=False)
    t0 = time.perf_counter()
    result = build(recipe, conv, root / "build")
    record("build_s", time.perf_counter() - t0)
    assert result.built and result.plan.kv_block_reuse
    assert (result.out / "target" / "timing.cache").is_file() and not Path("model.cache").exists()
    return read_checkpoint(conv), conv, result.out
