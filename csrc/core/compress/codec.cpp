// encode / decode / decode_accumulate over the kernels (cast.h,
// quantize.h, reduce.h).  Error feedback works in cache-sized blocks so its
// extra passes (add residual, encode, decode, subtract) read memory once.
#include "core/compress/codec.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/kernels/cast.h"
#include "core/kernels/quantize.h"
#include "core/kernels/reduce.h"
#include "core/kernels/threads.h"

namespace hcomm {
namespace compress {
namespace {

bool is_fp8(DType d) { return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2; }

size_t scale_bytes(int64_t n, const WireFormat& fmt) {
  return is_fp8(fmt.wire) ? static_cast<size_t>(kernels::num_chunks(n, fmt.chunk)) * sizeof(float) : 0;
}

// Encodes [b, e) of an fp32 block into the wire buffer of the whole
// n-element message (b is a multiple of the chunk for fp8).
void encode_f32_range(const float* x, int64_t b, int64_t e, int64_t n, const WireFormat& fmt, char* wire) {
  if (is_fp8(fmt.wire)) {
    auto* scales = reinterpret_cast<float*>(wire);
    auto* q = reinterpret_cast<uint8_t*>(wire + scale_bytes(n, fmt));
    kernels::quantize_fp8(x, DType::kFloat32, e - b, fmt.wire, fmt.chunk, q + b, scales + b / fmt.chunk);
  } else {
    kernels::cast(x, DType::kFloat32, wire + b * dtype_size(fmt.wire), fmt.wire, e - b);
  }
}

void decode_f32_range(const char* wire, int64_t b, int64_t e, int64_t n, const WireFormat& fmt, float* out) {
  if (is_fp8(fmt.wire)) {
    auto* scales = reinterpret_cast<const float*>(wire);
    auto* q = reinterpret_cast<const uint8_t*>(wire + scale_bytes(n, fmt));
    kernels::dequantize_fp8(q + b, scales + b / fmt.chunk, e - b, fmt.wire, fmt.chunk, out, DType::kFloat32);
  } else {
    kernels::cast(wire + b * dtype_size(fmt.wire), fmt.wire, out, DType::kFloat32, e - b);
  }
}

}  // namespace

bool wire_supported(const WireFormat& fmt, bool throw_if_not) {
  const bool ok = (fmt.wire == DType::kFloat32 || fmt.wire == DType::kBFloat16 || fmt.wire == DType::kFloat16 ||
                   is_fp8(fmt.wire)) &&
                  (!is_fp8(fmt.wire) || fmt.chunk > 0);
  if (!ok && throw_if_not)
    throw Error(ErrorKind::kInvalidArgument, std::string("wire format ") + dtype_name(fmt.wire) + " (chunk " +
                                                 std::to_string(fmt.chunk) +
                                                 ") is not supported: use float32, bfloat16, float16 or fp8 "
                                                 "e4m3/e5m2 with a positive chunk");
  return ok;
}

size_t encoded_bytes(int64_t n, const WireFormat& fmt) {
  wire_supported(fmt, true);
  if (n <= 0) return 0;
  return static_cast<size_t>(n) * dtype_size(fmt.wire) + scale_bytes(n, fmt);
}

float* Residual::data(int64_t n) {
  if (static_cast<int64_t>(r_.size()) != n) r_.assign(static_cast<size_t>(n), 0.0f);
  return r_.data();
}

void encode(const void* src, DType src_dtype, int64_t n, const WireFormat& fmt, void* wire, Residual* ef) {
  wire_supported(fmt, true);
  HCOMM_CHECK_ARG(src_dtype == DType::kFloat32 || src_dtype == DType::kBFloat16 || src_dtype == DType::kFloat16,
                  std::string("compress: source dtype ") + dtype_name(src_dtype) + " is not fp32/bf16/fp16");
  if (n <= 0) return;
  char* w = static_cast<char*>(wire);
  if (ef == nullptr) {
    if (is_fp8(fmt.wire)) {
      kernels::quantize_fp8(src, src_dtype, n, fmt.wire, fmt.chunk, reinterpret_cast<uint8_t*>(w + scale_bytes(n, fmt)),
                            reinterpret_cast<float*>(w));
    } else {
      kernels::cast(src, src_dtype, w, fmt.wire, n);
    }
    return;
  }
  float* r = ef->data(n);
  // 64 Ki elements (256 KiB of fp32), a whole number of fp8 chunks.
  const int64_t chunk = is_fp8(fmt.wire) ? fmt.chunk : 1;
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 16) / chunk) * chunk;
  const size_t ssz = dtype_size(src_dtype);
  const char* s = static_cast<const char*>(src);
  kernels::parallel_for(n, block, ssz + 2 * 4 + dtype_size(fmt.wire) + 4, [&](int64_t pb, int64_t pe) {
    thread_local std::vector<float> x, back;
    for (int64_t b = pb; b < pe; b += block) {
      const int64_t e = std::min(pe, b + block), len = e - b;
      x.resize(static_cast<size_t>(len));
      back.resize(static_cast<size_t>(len));
      kernels::cast(s + b * ssz, src_dtype, x.data(), DType::kFloat32, len);
      kernels::reduce_into(x.data(), r + b, len, DType::kFloat32, ReduceOp::kSum);  // x + r
      encode_f32_range(x.data(), b, e, n, fmt, w);
      decode_f32_range(w, b, e, n, fmt, back.data());
      for (int64_t i = 0; i < len; ++i) r[b + i] = x[i] - back[i];  // what was not sent
    }
  });
}

void decode(const void* wire, int64_t n, const WireFormat& fmt, void* dst, DType dst_dtype) {
  wire_supported(fmt, true);
  if (n <= 0) return;
  const char* w = static_cast<const char*>(wire);
  if (is_fp8(fmt.wire)) {
    kernels::dequantize_fp8(reinterpret_cast<const uint8_t*>(w + scale_bytes(n, fmt)),
                            reinterpret_cast<const float*>(w), n, fmt.wire, fmt.chunk, dst, dst_dtype);
  } else {
    kernels::cast(w, fmt.wire, dst, dst_dtype, n);
  }
}

void decode_accumulate(const void* wire, int64_t n, const WireFormat& fmt, void* acc, DType acc_dtype, ReduceOp op) {
  wire_supported(fmt, true);
  if (n <= 0) return;
  const char* w = static_cast<const char*>(wire);
  if (is_fp8(fmt.wire)) {
    kernels::dequantize_accumulate(reinterpret_cast<const uint8_t*>(w + scale_bytes(n, fmt)),
                                   reinterpret_cast<const float*>(w), n, fmt.wire, fmt.chunk, acc, acc_dtype, op);
  } else {
    kernels::reduce_into_cast(acc, acc_dtype, w, fmt.wire, n, op);
  }
}

}  // namespace compress
}  // namespace hcomm
