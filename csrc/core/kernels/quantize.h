// FP8 quantization with one fp32 scale per chunk of `chunk` elements.
//
// For chunk c: amax = largest finite |x| in it, scale = max(amax / fmt_max,
// 2^-126), q = fp8(x * (1 / scale)) with fp8.h's rounding and saturation,
// and x' = fp32(q) * scale on the way back.  The fp32 products are rounded
// separately (never fused) so every CPU path and the CUDA kernels agree to
// the bit.  Relative error per element is at most 2^-4 (e4m3) or 2^-3 (e5m2)
// of |x| for values in the normal range of the scaled format; values below
// scale * 2^-6 (e4m3) or scale * 2^-14 (e5m2) lose relative precision.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hcomm {
namespace kernels {

inline int64_t num_chunks(int64_t n, int64_t chunk) { return n <= 0 ? 0 : (n + chunk - 1) / chunk; }

// src: n elements of fp32/bf16/fp16; fmt: kFloat8E4M3 or kFloat8E5M2;
// q: n bytes; scales: num_chunks(n, chunk) floats.
void quantize_fp8(const void* src, DType src_dtype, int64_t n, DType fmt, int64_t chunk, uint8_t* q,
                  float* scales);

// dst[i] = fp32(q[i]) * scales[i / chunk], stored as dst_dtype (fp32/bf16/fp16).
void dequantize_fp8(const uint8_t* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* dst,
                    DType dst_dtype);

// acc[i] = acc[i] OP (fp32(q[i]) * scales[i / chunk]), in fp32, acc stored
// as acc_dtype (fp32/bf16/fp16): what a receiver does with a peer's
// compressed contribution, without materialising it.
void dequantize_accumulate(const uint8_t* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* acc,
                           DType acc_dtype, ReduceOp op);

}  // namespace kernels
}  // namespace hcomm
