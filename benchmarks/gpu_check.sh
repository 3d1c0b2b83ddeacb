#!/usr/bin/env bash
# One prepared device check (issue 13). On a CUDA machine (< 8 min on one GPU): the equivalence
# tests on CUDA, then the pydoc benchmark in bf16 (with its warming tokens/s line). Without CUDA
# a reduced mode (tests/core/test_gpu_check.py runs it): one equivalence test and a one-prompt
# benchmark (on CACHEBLEND_CHECK_MODEL, a model directory; default the bundled model).
# Everything goes to one file: RESULTS (default gpu_check_results.txt).
#
#   benchmarks/gpu_check.sh [RESULTS]        PYTHON=... to choose the interpreter
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=$(realpath -m "${1:-gpu_check_results.txt}")
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD/core:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0

step() {  # step NAME COMMAND...: runs it, appends its output and exit status to RESULTS
    echo "== $1" >>"$RESULTS"
    local t0=$SECONDS
    "${@:2}" >>"$RESULTS" 2>&1
    local rc=$?
    echo "== $1: exit $rc in $((SECONDS - t0)) s" >>"$RESULTS"
    [ $rc -eq 0 ] || status=1
}

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    mode=cuda
else
    mode=cpu
fi
{ echo "gpu_check: mode $mode, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
} >"$RESULTS" 2>&1

if [ "$mode" = cuda ]; then
    step "equivalence tests on CUDA" env CACHEBLEND_TEST_DEVICE=cuda timeout 240 "$PY" -m pytest -q \
        -p no:cacheprovider tests/core/test_equivalence.py tests/core/test_rope.py tests/core/test_families.py \
        tests/core/test_attention.py
    step "pydoc benchmark, bf16" timeout 300 "$PY" -m cacheblend.cli bench --device cuda --dtype bfloat16 \
        --prompts 4 --repeats 3 --out "$WORK/bench"
else
    step "one equivalence test on CPU" timeout 120 "$PY" -m pytest -q -p no:cacheprovider \
        "tests/core/test_equivalence.py::test_ratio_one_with_cached_chunks_equals_full_prefill[llama]"
    step "pydoc benchmark, reduced" timeout 180 "$PY" -m cacheblend.cli bench --device cpu --prompts 1 --repeats 1 \
        --model "${CACHEBLEND_CHECK_MODEL:-smollm2-135m-instruct}" --chunks 2 --ratios 0.15 --answer-tokens 2 --out "$WORK/bench"
fi
echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" >>"$RESULTS"
exit $status
