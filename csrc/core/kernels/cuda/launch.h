// CUDA kernels callable from C++ without CUDA headers: device pointers are
// void*, the stream is a cudaStream_t passed as void* (nullptr = the legacy
// default stream).  Same semantics and the same bits as the CPU kernels in
// reduce.h, cast.h and quantize.h (they share half.h/fp8.h).  Launches are
// asynchronous on `stream`; launch errors throw hcomm::Error (kRuntime),
// bad arguments throw kInvalidArgument before anything is launched.
// Defined in cuda/*.cu, built only when HCOMM_WITH_CUDA is defined.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hcomm {
namespace kernels {

// acc[i] = acc[i] OP src[i]; dtype fp32/bf16/fp16; op sum/avg/product/min/max.
void cuda_reduce_into(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op, void* stream);

// acc (fp32/bf16/fp16) OP= src (any float format, unscaled), in fp32.
void cuda_reduce_into_cast(void* acc, DType acc_dtype, const void* src, DType src_dtype, int64_t n, ReduceOp op,
                           void* stream);

// dst = src converted, among fp32/bf16/fp16/fp8 e4m3/fp8 e5m2.
void cuda_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, void* stream);

// Per-chunk scaled fp8, as quantize.h; q: n bytes, scales: num_chunks floats (device memory).
void cuda_quantize_fp8(const void* src, DType src_dtype, int64_t n, DType fmt, int64_t chunk, void* q, float* scales,
                       void* stream);
void cuda_dequantize_fp8(const void* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* dst,
                         DType dst_dtype, void* stream);
void cuda_dequantize_accumulate(const void* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* acc,
                                DType acc_dtype, ReduceOp op, void* stream);

}  // namespace kernels
}  // namespace hcomm
