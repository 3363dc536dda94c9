// Elementwise reductions the collectives apply to received data.
// fp16 and bf16 are accumulated in fp32 and rounded once per call.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hcomm {
namespace kernels {

// acc[i] = acc[i] OP src[i].  kAvg reduces as kSum; finish with divide_by().
// bool: sum/max/bor are logical or, product/min/band logical and, bxor xor.
// fp32/bf16/fp16 with sum/avg/product/min/max run the vectorised kernels for
// the CPU's ISA (isa.h), split across cores above threads.h's threshold;
// min/max propagate NaN like torch.minimum/maximum.
void reduce_into(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op);

// acc[i] = acc[i] OP src[i] with acc and src of different float types
// (acc: fp32/bf16/fp16; src: those or fp8, unscaled), computed in fp32:
// e.g. a bf16 wire buffer summed into an fp32 accumulator.
void reduce_into_cast(void* acc, DType acc_dtype, const void* src, DType src_dtype, int64_t n, ReduceOp op);

// data[i] = data[i] / divisor (float types: true division; integers: towards
// zero, the way NCCL's average of integers rounds).
void divide_by(void* data, int64_t n, DType dtype, int64_t divisor);

// The scalar loops for every dtype (reduce_portable.cpp); reduce_into()
// uses them for the dtypes the vector kernels do not cover.
void reduce_into_generic(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op);

}  // namespace kernels
}  // namespace hcomm
