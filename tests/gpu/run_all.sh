#!/usr/bin/env bash
# The one command for a GPU machine (docs/gpu.md): every test in tests/gpu, then the kernel
# benchmark, with results under $OUT. Needs no network: Python packages the machine lacks come
# as wheels in .whl/ (docs/gpu.md says which and how to fetch them), installed with --no-index;
# the package is used from this checkout through an overlay in the installed layout (plugins/,
# perf/ and recipes/ inside trtllm_dflash/, as setup.py maps them), not pip-installed, so its
# pinned torch is never resolved. Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
work="$(mktemp -d -t trtllm_dflash_gpu.XXXXXX)" || exit 1
trap 'rm -rf "$work"' EXIT
site="$work/site"          # the wheels of .whl/
overlay="$work/overlay"    # the package in its installed layout

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
        || { echo "run_all: installing .whl/ failed" >&2; exit 1; }
fi
mkdir -p "$overlay"
cp -r trtllm_dflash "$overlay/" && cp -r plugins "$overlay/trtllm_dflash/plugins" \
    && cp -r perf "$overlay/trtllm_dflash/perf" && cp -r recipes "$overlay/trtllm_dflash/recipes" || exit 1
export PYTHONPATH="$overlay:$site${PYTHONPATH:+:$PYTHONPATH}"

{
    nvidia-smi -L || echo "nvidia-smi: not found"
    python3 -P -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| triton', triton.__version__, '| cuda', torch.version.cuda)"
    python3 -P -c "import trtllm_dflash.plugins.kv_inject_attention.ptx as p; \
print('triton appends', p.triton_extra_params(), 'kernel parameters: the AOT plugins declare that many padding outputs')" \
        2>/dev/null || echo "triton ABI probe: failed (no GPU?)"
    python3 -P -c "import tensorrt_llm; print('tensorrt_llm', tensorrt_llm.__version__)" 2>/dev/null \
        || echo "tensorrt_llm: not installed (first-GPU checklist items 1-4 skip: docs/design/engine-path.md)"
} 2>&1 | tee "$OUT/env.txt"

python3 -P -m pytest -q -p no:cacheprovider -m gpu -rA -o junit_family=xunit1 tests/gpu --junitxml="$OUT/gpu_tests.xml" 2>&1 \
    | tee "$OUT/gpu_tests.log"
rc=${PIPESTATUS[0]}

case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) hw=h200 ;; *B200*) hw=b200 ;; *B300*) hw=b300 ;; *) hw=h100-sxm ;;
esac
for variant in "" "--fp8-cache" "--window 2048 --causal-block"; do
    # shellcheck disable=SC2086
    python3 -P -m trtllm_dflash.perf.bench_kv_inject --hardware "$hw" --batch 1 8 32 64 \
        --cache-len 1024 4096 16384 --dtype bf16 $variant
done 2>&1 | tee "$OUT/bench_kv_inject.log"

echo "run_all: pytest exit status $rc; results in $OUT"
exit "$rc"
