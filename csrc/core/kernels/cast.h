// Conversions between the float formats, one pass over memory.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hcomm {
namespace kernels {

// dst[i] = src[i] converted, for src/dst in fp32, bf16, fp16, fp8 e4m3,
// fp8 e5m2.  Round to nearest even everywhere; to fp16/bf16 overflow gives
// inf as in IEEE and torch; to fp8 it saturates (fp8.h says why), without a
// scale (see quantize.h for scaled fp8).  Same dtype: a copy.
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

}  // namespace kernels
}  // namespace hcomm
