#!/usr/bin/env bash
# The test command (README, .ci/run): set up the venv, build, compile-check
# the CUDA build, run every test tier.  Tiers that need what this machine
# lacks (a GPU; root for the emulator) skip themselves with the reason.
# Extra arguments go to pytest.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/scripts/setup-env.sh" | tail -n 1) || exit 1
cd "$root"
# The CUDA build is compile-checked on every run, so CUDA code cannot rot on
# machines without a GPU (a CUDA torch in its own cached venv; see the script).
# It runs first so that pytest's summary is the last thing printed.
if [ "${HCOMM_SKIP_CUDA_CHECK:-0}" = "1" ]; then
  echo "test.sh: CUDA compile check skipped (HCOMM_SKIP_CUDA_CHECK=1)"
elif ! command -v nvcc >/dev/null 2>&1; then
  echo "test.sh: CUDA compile check skipped: no nvcc on PATH"
else
  bash "$root/.ci/cuda_compile_check.sh" || { echo "test.sh: CUDA compile check failed" >&2; exit 1; }
fi
# the slowest tests listed: the whole run must stay well inside CI's time
"$venv/bin/python" -m pytest tests -q -ra --durations=15 "$@"
rc=$?
# pytest exits 5 when it collected no tests: that is a broken suite here.
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
