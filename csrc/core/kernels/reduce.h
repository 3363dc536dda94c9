// Elementwise reductions the collectives apply to received data.
// fp16 and bf16 are accumulated in fp32 and rounded once per call.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hcomm {
namespace kernels {

// acc[i] = acc[i] OP src[i].  kAvg reduces as kSum; finish with divide_by().
// bool: sum/max/bor are logical or, product/min/band logical and, bxor xor.
void reduce_into(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op);

// data[i] = data[i] / divisor (float types: true division; integers: towards
// zero, the way NCCL's average of integers rounds).
void divide_by(void* data, int64_t n, DType dtype, int64_t divisor);

}  // namespace kernels
}  // namespace hcomm
