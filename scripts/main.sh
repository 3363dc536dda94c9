#!/usr/bin/env bash
# The main job on its embedded default: `hcomm train` with no arguments trains
# the small Llama-style model on the default emulated mixed cluster (A100 x2 +
# V100 x2, islands joined by a ~10x slower link) with hcomm's searched plan and
# with the homogeneous baseline (equal batches, torch DDP over gloo), side by
# side, and prints the speed-up at equal loss.  A few minutes on 2 cores.
# Extra arguments go to `hcomm train` (see `hcomm train --help`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/scripts/setup-env.sh" | tail -n 1)
cd "$root"
exec "$venv/bin/hcomm" train "$@"
