#!/usr/bin/env bash
# One prepared device check (issue 13). On a CUDA machine (< 8 min on one GPU): the equivalence
# tests on CUDA, then the pydoc benchmark in bf16 (with its warming tokens/s line). Without CUDA
# a reduced mode (tests/core/test_gpu_check.py runs it): one equivalence test and a one-prompt
# benchmark (on CACHEBLEND_CHECK_MODEL, a model directory; default the bundled model).
# Everything goes to one file: RESULTS (default gpu_check_results.txt).
#
#   benchmarks/gpu_check.sh [--quick] [--model M] [RESULTS]     PYTHON=... to choose the interpreter
#
#   --quick     the reduced mode even on a CUDA machine (what CI runs: tests/core/test_gpu_check.py)
#   --model M   the model alias or path the benchmark runs (default CACHEBLEND_CHECK_MODEL, else the
#               bundled smollm2-135m-instruct)
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
quick=0 RESULTS_ARG=""
CHECK_MODEL=${CACHEBLEND_CHECK_MODEL:-smollm2-135m-instruct}
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --quick) quick=1 ;;
        --model) [ $# -ge 2 ] || { echo "--model needs a value" >&2; exit 2; }; CHECK_MODEL=$2; shift ;;
        -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
        *) RESULTS_ARG=$1 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
RESULTS=$(realpath -m "${RESULTS_ARG:-gpu_check_results.txt}")
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

if [ $quick -eq 0 ] && "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    mode=cuda
else
    mode=cpu
fi
{ echo "gpu_check: mode $mode, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null), model $CHECK_MODEL, load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null), $(nproc) CPUs"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
} >"$RESULTS" 2>&1

if [ "$mode" = cuda ]; then
    step "equivalence tests on CUDA" env CACHEBLEND_TEST_DEVICE=cuda timeout 240 "$PY" -m pytest -q \
        -p no:cacheprovider tests/core/test_equivalence.py tests/core/test_rope.py tests/core/test_families.py \
        tests/core/test_attention.py
    step "pydoc benchmark, bf16" timeout 300 "$PY" -m cacheblend.cli bench --device cuda --dtype bfloat16 \
        --model "$CHECK_MODEL" --prompts 4 --repeats 3 --out "$WORK/bench"
else
    step "one equivalence test on CPU" timeout 120 "$PY" -m pytest -q -p no:cacheprovider \
        "tests/core/test_equivalence.py::test_ratio_one_with_cached_chunks_equals_full_prefill[llama]"
    step "pydoc benchmark, reduced" timeout 180 "$PY" -m cacheblend.cli bench --device cpu --prompts 1 --repeats 1 \
        --model "$CHECK_MODEL" --chunks 2 --ratios 0.15 --answer-tokens 2 --out "$WORK/bench"
fi
echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)" >>"$RESULTS"
exit $status
