#!/usr/bin/env bash
# The test command (README, .ci/run): set up the venv, build, run every tier.
# Tiers that need what this machine lacks (a GPU; root for the emulator)
# skip themselves with the reason.  Extra arguments go to pytest.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/scripts/setup-env.sh" | tail -n 1) || exit 1
cd "$root"
"$venv/bin/python" -m pytest tests -q -ra "$@"
rc=$?
# pytest exits 5 when it collected no tests: that is a broken suite here.
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
