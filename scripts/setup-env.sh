#!/usr/bin/env bash
# Creates (or reuses) the project virtualenv and builds hcomm into it.
# Idempotent: a second run only rebuilds what changed (ninja).
#   HCOMM_VENV   where the venv lives (default: .venv in the repo)
#   HCOMM_TORCH  torch requirement (default: torch==2.13.0, the CPU build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${HCOMM_VENV:-$root/.venv}
torch_req=${HCOMM_TORCH:-torch==2.13.0}

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch, yaml, numpy, pytest, hypothesis, matplotlib, ninja, tqdm, tokenizers, transformers, datasets" 2>/dev/null; then
  "$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$py" -m pip install -q "$torch_req" numpy pyyaml pytest hypothesis matplotlib ninja tqdm tokenizers transformers datasets setuptools wheel
fi
# Build the extension against the torch in the venv (no build isolation:
# an isolated build would pull a second torch).
export MAX_JOBS=${MAX_JOBS:-2}
so=$(ls "$root"/hcomm/_C*.so 2>/dev/null | head -n 1 || true)
if [ -n "$so" ] && "$py" -c "import hcomm, hcomm._C" >/dev/null 2>&1 \
   && [ -z "$(find "$root/csrc" "$root/python" "$root/setup.py" -newer "$so" -print -quit)" ]; then
  :  # built, and no source is newer than the extension
else
  "$py" -m pip install -q --no-build-isolation --no-deps -e "$root"
fi
"$py" -c "import hcomm, hcomm._C" >/dev/null
echo "$venv"
