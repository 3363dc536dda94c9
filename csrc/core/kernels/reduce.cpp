// reduce_into / reduce_into_cast: float formats go to the dispatched vector
// kernels (isa.h), split across cores for large buffers (threads.h); other
// dtypes go to the generic scalar loops.
#include "core/kernels/reduce.h"

#include <string>

#include "core/error.h"
#include "core/kernels/isa.h"
#include "core/kernels/threads.h"

namespace hcomm {
namespace kernels {

void reduce_into_cast(void* acc, DType acc_dtype, const void* src, DType src_dtype, int64_t n, ReduceOp op) {
  if (n <= 0) return;
  Fmt af, sf;
  FOp fop;
  HCOMM_CHECK_ARG(to_fmt(acc_dtype, &af) && static_cast<int>(af) < kNumAccFmt,
                  std::string("reduce: accumulator dtype ") + dtype_name(acc_dtype) + " is not fp32/bf16/fp16");
  HCOMM_CHECK_ARG(to_fmt(src_dtype, &sf), std::string("reduce: source dtype ") + dtype_name(src_dtype) +
                                              " is not a float format the kernels read");
  HCOMM_CHECK_ARG(to_fop(op, &fop), std::string("reduce op ") + reduce_op_name(op) + " is not supported for " +
                                        dtype_name(acc_dtype));
  auto fn = active_table().accumulate[static_cast<int>(af)][static_cast<int>(sf)][static_cast<int>(fop)];
  const size_t asz = dtype_size(acc_dtype), ssz = dtype_size(src_dtype);
  char* a = static_cast<char*>(acc);
  const char* s = static_cast<const char*>(src);
  parallel_for(n, 64, 2 * asz + ssz, [&](int64_t b, int64_t e) { fn(a + b * asz, s + b * ssz, e - b, 1.0f); });
}

void reduce_into(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op) {
  if (n <= 0) return;
  std::string why;
  HCOMM_CHECK_ARG(reduce_supported(dtype, op, &why), why);
  Fmt f;
  FOp fop;
  if (to_fmt(dtype, &f) && static_cast<int>(f) < kNumAccFmt && to_fop(op, &fop)) {
    return reduce_into_cast(acc, dtype, src, dtype, n, op);
  }
  reduce_into_generic(acc, src, n, dtype, op);
}

}  // namespace kernels
}  // namespace hcomm
