#!/usr/bin/env bash
# Compile-checks the CUDA build of hcomm._C on a machine without a GPU.
#
# - A CUDA torch (2.14.1, cu130, from the local wheel store) lives in its own
#   venv, $HCOMM_CUDA_VENV (default /opt/hcomm-cuda-venv), created once and
#   reused while it holds that torch; the CPU venv and its editable install
#   are never touched.
# - CUDA_HOME is the toolkit that the `nvcc` on PATH is, or execs (the
#   machine's /usr/local/bin/nvcc is a wrapper script).
# - The sources are mirrored into $HCOMM_CUDA_CACHE/src by content, so
#   unchanged files keep their mtimes and ninja (build dir
#   $HCOMM_CUDA_CACHE/build) recompiles only what changed.  A stamp keyed by
#   the hash of the sources, torch version and arch list skips the build
#   entirely when nothing changed.  ccache is used when installed.
# - Fails (non-zero) on any compile or link error, and checks that the
#   built module exports the CUDA entry points.
#
# Usage: .ci/cuda_compile_check.sh   (from anywhere in the repository)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HCOMM_CUDA_VENV:-/opt/hcomm-cuda-venv}"
CACHE="${HCOMM_CUDA_CACHE:-/var/cache/hcomm-cuda-check}"
TORCH_SPEC="${HCOMM_CUDA_TORCH:-torch==2.14.1}"
ARCHS="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
JOBS="${MAX_JOBS:-2}"
start=$(date +%s)

log() { echo "[cuda-compile-check] $*"; }

# 1. The CUDA venv.
want_version="${TORCH_SPEC#torch==}"
have_version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [[ "$have_version" != "$want_version" ]]; then
  log "creating $VENV with $TORCH_SPEC (once; about a minute)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "$TORCH_SPEC" numpy ninja setuptools wheel pyyaml
fi
"$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else "torch in the CUDA venv has no CUDA")'

# 2. CUDA_HOME from nvcc (follow a wrapper that execs the real one).
if [[ -z "${CUDA_HOME:-}" ]]; then
  nvcc_path="$(command -v nvcc || true)"
  [[ -n "$nvcc_path" ]] || { echo "nvcc not found on PATH" >&2; exit 1; }
  real="$(grep -Eo '/[^ "]*/bin/nvcc' "$nvcc_path" 2>/dev/null | head -n1 || true)"
  [[ -n "$real" && -x "$real" ]] || real="$(readlink -f "$nvcc_path")"
  CUDA_HOME="$(dirname "$(dirname "$real")")"
fi
export CUDA_HOME
log "CUDA_HOME=$CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | grep -Eo 'release [0-9.]+'))"

# 3. Mirror the sources; skip when the stamp matches.
mkdir -p "$CACHE/src" "$CACHE/build" "$CACHE/lib"
python3 - "$ROOT" "$CACHE/src" <<'PY'
# Copy only files whose bytes changed (unchanged ones keep their mtime, so
# ninja does not rebuild them) and delete files gone from the repository.
import filecmp, os, shutil, sys
root, dst = sys.argv[1:3]
keep = set()
for top in ("setup.py", "pyproject.toml", "README.md", "csrc", "python", "hcomm"):
    src = os.path.join(root, top)
    if os.path.isfile(src):
        files = [top]
    elif os.path.isdir(src):
        files = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(src)
                 for f in fs if not f.endswith((".so", ".pyc"))]
    else:
        files = []
    for rel in files:
        keep.add(rel)
        s, t = os.path.join(root, rel), os.path.join(dst, rel)
        if not os.path.exists(t) or not filecmp.cmp(s, t, shallow=False):
            os.makedirs(os.path.dirname(t), exist_ok=True)
            shutil.copy2(s, t)
for d, _, fs in os.walk(dst):
    for f in fs:
        rel = os.path.relpath(os.path.join(d, f), dst)
        if rel not in keep:
            os.remove(os.path.join(d, f))
PY
key="$( (cd "$CACHE/src" && find . -type f -print0 | sort -z | xargs -0 sha256sum; \
        "$VENV/bin/python" -c 'import torch; print(torch.__version__)'; echo "$ARCHS") | sha256sum | cut -c1-16)"
if [[ -f "$CACHE/stamp" && "$(cat "$CACHE/stamp")" == "$key" ]]; then
  log "sources unchanged since the last successful check ($key): OK in $(( $(date +%s) - start )) s"
  exit 0
fi

# 4. Build.
if command -v ccache >/dev/null 2>&1; then export CXX="ccache g++" CC="ccache gcc"; fi
log "building with TORCH_CUDA_ARCH_LIST=$ARCHS MAX_JOBS=$JOBS"
(cd "$CACHE/src" && HCOMM_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST="$ARCHS" MAX_JOBS="$JOBS" \
  "$VENV/bin/python" setup.py -q build_ext --build-temp "$CACHE/build" --build-lib "$CACHE/lib" >"$CACHE/build.log" 2>&1) || {
  grep -E 'error|Error' "$CACHE/build.log" | head -n 40 >&2 || true
  tail -n 40 "$CACHE/build.log" >&2
  exit 1
}
so="$(find "$CACHE/lib" -name '_C*.so' | head -n1)"
[[ -n "$so" ]] || { echo "no _C*.so produced" >&2; exit 1; }
# The module links against the CUDA torch; without a GPU it still imports.
# Import it as part of the package (its bindings import hcomm.errors, and
# `import hcomm` registers the backend with the CUDA device list).
cp "$so" "$CACHE/src/hcomm/"
(cd "$CACHE/src" && "$VENV/bin/python" -c '
import torch, hcomm, hcomm._C as C
import torch.distributed as dist
assert "cuda" in dist.Backend.backend_capability["hcomm"], dist.Backend.backend_capability["hcomm"]
k = C.kernels
assert k.has_cuda, "built without HCOMM_WITH_CUDA"
for f in ("cuda_reduce_into", "cuda_cast", "cuda_quantize_fp8", "cuda_dequantize_fp8", "cuda_dequantize_accumulate"):
    assert hasattr(k, f), f
print("hcomm._C imports; CUDA kernels bound")') || { echo "import check failed" >&2; exit 1; }
echo "$key" > "$CACHE/stamp"
log "OK in $(( $(date +%s) - start )) s"
