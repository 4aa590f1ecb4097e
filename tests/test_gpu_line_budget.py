"""The GPU-only layer stays thin: code in files that import tensorrt or tensorrt_llm (anywhere in
the file, lazily or not) is at most 15% of the package's code (trtllm_dflash/, plugins/ and perf/,
which ship as one package). Code lines: non-blank lines that are not comments; docstrings count."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("trtllm_dflash", "plugins", "perf")
BUDGET = 0.15
GPU_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:tensorrt|tensorrt_llm)(?:[\s.]|$)", re.M)


def code_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#"))


def test_gpu_only_code_is_at_most_15_percent_of_the_package():
    files = sorted(p for top in PACKAGE for p in (ROOT / top).rglob("*.py"))
    total = sum(code_lines(p) for p in files)
    gpu = {str(p.relative_to(ROOT)): code_lines(p) for p in files if GPU_IMPORT.search(p.read_text())}
    share = sum(gpu.values()) / total
    report = ", ".join(f"{name} {n}" for name, n in sorted(gpu.items(), key=lambda kv: -kv[1]))
    assert share <= BUDGET, (f"GPU-only code is {sum(gpu.values())} of {total} code lines ({share:.1%}), over the "
                             f"{BUDGET:.0%} budget: {report}")
    # The layer this budget is about exists (the regex finds it).
    assert {"trtllm_dflash/engines/trtllm_models.py", "trtllm_dflash/runtime/trt_runners.py"} <= set(gpu), report
    print(f"GPU-only: {sum(gpu.values())} of {total} code lines ({share:.1%}): {report}")
