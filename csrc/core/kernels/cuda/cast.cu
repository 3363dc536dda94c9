// cuda_cast: the flat elementwise kernel as a pure conversion.
#include "core/kernels/cuda/elementwise.cuh"
#include "core/kernels/cuda/launch.h"

namespace hcomm {
namespace kernels {

void cuda_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, void* stream) {
  Fmt sf, df;
  HCOMM_CHECK_ARG(to_fmt(src_dtype, &sf) && to_fmt(dst_dtype, &df),
                  std::string("cuda cast from ") + dtype_name(src_dtype) + " to " + dtype_name(dst_dtype) +
                      " is not supported (float32/bfloat16/float16/float8 only)");
  if (n <= 0) return;
  if (src_dtype == dst_dtype) {
    cudaError_t err = cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(src_dtype),
                                      cudaMemcpyDeviceToDevice, cuda::as_stream(stream));
    if (err != cudaSuccess) throw Error(ErrorKind::kRuntime, std::string("cuda_cast: ") + cudaGetErrorString(err));
    return;
  }
  cuda::with_fmt(df, [&](auto d) {
    cuda::with_fmt(sf, [&](auto s) {
      cuda::launch_flat<decltype(d)::value, decltype(s)::value, cuda::kAssign>(dst, src, n, cuda::as_stream(stream),
                                                                               "cuda_cast");
    });
  });
}

}  // namespace kernels
}  // namespace hcomm
