// cuda_reduce_into / cuda_reduce_into_cast: the flat elementwise kernel
// with a reduce op, accumulating in fp32.
#include "core/kernels/cuda/elementwise.cuh"
#include "core/kernels/cuda/launch.h"

namespace hcomm {
namespace kernels {

void cuda_reduce_into_cast(void* acc, DType acc_dtype, const void* src, DType src_dtype, int64_t n, ReduceOp op,
                           void* stream) {
  Fmt af, sf;
  FOp fop;
  HCOMM_CHECK_ARG(to_fmt(acc_dtype, &af) && static_cast<int>(af) < kNumAccFmt,
                  std::string("cuda reduce: accumulator dtype ") + dtype_name(acc_dtype) + " is not fp32/bf16/fp16");
  HCOMM_CHECK_ARG(to_fmt(src_dtype, &sf),
                  std::string("cuda reduce: source dtype ") + dtype_name(src_dtype) + " is not a float format");
  HCOMM_CHECK_ARG(to_fop(op, &fop), std::string("cuda reduce: op ") + reduce_op_name(op) + " is not supported for " +
                                        dtype_name(acc_dtype) + " (sum/avg/product/min/max)");
  if (n <= 0) return;
  cuda::with_wide_fmt(af, [&](auto a) {
    cuda::with_fmt(sf, [&](auto s) {
      cuda::with_fop(fop, [&](auto o) {
        cuda::launch_flat<decltype(a)::value, decltype(s)::value, decltype(o)::value>(acc, src, n, cuda::as_stream(stream),
                                                                                      "cuda_reduce_into");
      });
    });
  });
}

void cuda_reduce_into(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op, void* stream) {
  cuda_reduce_into_cast(acc, dtype, src, dtype, n, op, stream);
}

}  // namespace kernels
}  // namespace hcomm
