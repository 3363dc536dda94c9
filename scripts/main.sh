#!/usr/bin/env bash
# The main job on its embedded default: hcomm against gloo, side by side.
# Extra arguments go to `hcomm demo` (see `hcomm demo --help`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/scripts/setup-env.sh" | tail -n 1)
cd "$root"
exec "$venv/bin/hcomm" demo "$@"
