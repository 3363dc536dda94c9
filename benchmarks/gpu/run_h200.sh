#!/usr/bin/env bash
# One-shot GPU check for a lent H200 (torch 2.11+cu130, nvcc, ninja, pytest,
# 16 cores, nothing installable).  Run from the repository root:
#
#   bash benchmarks/gpu/run_h200.sh          # results under $OUT (or benchmarks/results)
#
# 1. builds hcomm._C in place with CUDA for sm_90 only (the H200) and 16 jobs;
# 2. runs tests/kernels (CPU tests and the GPU tests: CUDA kernels vs the CPU
#    kernels bit for bit, the hcomm backend on CUDA tensors with one rank);
# 3. runs the GPU kernel benchmark (each kernel vs a device copy of the same
#    bytes) and writes benchmarks/results/gpu-h200-<date>.md, plus the logs,
#    under $OUT when the device tool provides it;
# 4. measures the bridge's CUDA copy engine (pinned copies alone vs the
#    chunked device -> host -> device trip): staging-engine-h200-<date>.md.
# Each step's status is recorded; the script exits non-zero if any failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DATE="$(date +%F)"
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS" benchmarks/results
LOG="$RESULTS/gpu-h200-$DATE.log"
PY="${PYTHON:-python3}"
status=0
step() { echo "== $* ==" | tee -a "$LOG"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  nvcc --version | tail -n 2
} >>"$LOG" 2>&1

step "build (TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS=16)"
start=$(date +%s)
if HCOMM_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}" \
   "$PY" setup.py -q build_ext --inplace >>"$LOG" 2>&1; then
  echo "build OK in $(( $(date +%s) - start )) s" | tee -a "$LOG"
else
  echo "build FAILED" | tee -a "$LOG"; tail -n 60 "$LOG"; exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import hcomm._C as C; assert C.kernels.has_cuda, "built without CUDA"' >>"$LOG" 2>&1 || { echo "no CUDA in the build" | tee -a "$LOG"; exit 1; }

step "tests/kernels (CPU + GPU)"
if ! "$PY" -m pytest -q -p no:cacheprovider tests/kernels -rs --junitxml="$RESULTS/gpu-h200-$DATE-tests.xml" >>"$LOG" 2>&1; then
  status=1; echo "tests FAILED" | tee -a "$LOG"
fi
tail -n 15 "$LOG"

step "GPU kernel benchmark"
if ! "$PY" benchmarks/gpu/bench_gpu_kernels.py --mib 1024 --reps 50 --out "$RESULTS/gpu-h200-$DATE.md" >>"$LOG" 2>&1; then
  status=1; echo "benchmark FAILED" | tee -a "$LOG"
fi
[[ "$RESULTS" != benchmarks/results ]] && cp -f "$RESULTS/gpu-h200-$DATE.md" benchmarks/results/ 2>/dev/null

step "staging copy engine (pinned D2H/H2D alone vs the chunked bridge trip)"
if ! "$PY" benchmarks/gpu/bench_staging.py --mib 1024 --reps 10 --out "$RESULTS/staging-engine-h200-$DATE.md" >>"$LOG" 2>&1; then
  status=1; echo "staging benchmark FAILED" | tee -a "$LOG"
fi
[[ "$RESULTS" != benchmarks/results ]] && cp -f "$RESULTS/staging-engine-h200-$DATE.md" benchmarks/results/ 2>/dev/null
cat "$RESULTS/staging-engine-h200-$DATE.md" 2>/dev/null
cat "$RESULTS/gpu-h200-$DATE.md" 2>/dev/null
exit $status
