// The flat elementwise kernel behind cuda_reduce_into and cuda_cast:
// dst[i] = to_D(dst[i] OP from_S(src[i])), grid-stride over 8-element packs
// (16/32-byte loads when both pointers allow it), then the tail elements.
#pragma once

#include "core/kernels/cuda/common.cuh"

namespace hcomm {
namespace kernels {
namespace cuda {

constexpr int kFlatThreads = 256;

template <Fmt D, Fmt S, int OP>
__global__ void __launch_bounds__(kFlatThreads) flat_kernel(void* dst, const void* src, int64_t n, bool vec) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t npack = vec ? n / kPack : 0;
  for (int64_t j = tid; j < npack; j += stride) pack<D, S, OP, false>(dst, src, j, 1.0f);
  for (int64_t i = npack * kPack + tid; i < n; i += stride) one<D, S, OP, false>(dst, src, i, 1.0f);
}

template <Fmt D, Fmt S, int OP>
void launch_flat(void* dst, const void* src, int64_t n, cudaStream_t stream, const char* what) {
  const bool vec = pack_aligned<D>(dst) && pack_aligned<S>(src);
  const int64_t work = vec ? (n + kPack - 1) / kPack : n;
  flat_kernel<D, S, OP><<<grid_for(work, kFlatThreads), kFlatThreads, 0, stream>>>(dst, src, n, vec);
  check_launch(what);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace hcomm
