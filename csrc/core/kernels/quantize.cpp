// Per-chunk scaled fp8 (quantize.h).  Each chunk is handled by one thread:
// its amax pass leaves the chunk in L1/L2 for the encode pass that follows,
// and the piece boundaries of parallel_for fall on chunk boundaries.
#include "core/kernels/quantize.h"

#include <string>

#include "core/error.h"
#include "core/kernels/fp8.h"
#include "core/kernels/isa.h"
#include "core/kernels/threads.h"

namespace hcomm {
namespace kernels {
namespace {

float fmt_max(DType fmt) {
  HCOMM_CHECK_ARG(fmt == DType::kFloat8E4M3 || fmt == DType::kFloat8E5M2,
                  std::string("fp8 format must be float8_e4m3fn or float8_e5m2, got ") + dtype_name(fmt));
  return fmt == DType::kFloat8E4M3 ? fp8::kE4M3Max : fp8::kE5M2Max;
}

Fmt wide_fmt(DType dtype, const char* what) {
  Fmt f;
  HCOMM_CHECK_ARG(to_fmt(dtype, &f) && static_cast<int>(f) < kNumAccFmt,
                  std::string(what) + " dtype must be float32/bfloat16/float16, got " + dtype_name(dtype));
  return f;
}

void check_chunk(int64_t chunk) {
  HCOMM_CHECK_ARG(chunk > 0, "fp8 chunk must be positive, got " + std::to_string(chunk));
}

}  // namespace

void quantize_fp8(const void* src, DType src_dtype, int64_t n, DType fmt, int64_t chunk, uint8_t* q,
                  float* scales) {
  const float maxv = fmt_max(fmt);
  const Fmt sf = wide_fmt(src_dtype, "quantize source");
  check_chunk(chunk);
  if (n <= 0) return;
  const KernelTable& t = active_table();
  auto amax = t.amax[static_cast<int>(sf)];
  auto enc = t.convert[static_cast<int>(sf)][static_cast<int>(fmt == DType::kFloat8E4M3 ? Fmt::kE4M3 : Fmt::kE5M2)];
  const size_t ssz = dtype_size(src_dtype);
  const char* s = static_cast<const char*>(src);
  parallel_for(n, chunk, 2 * ssz + 1, [&](int64_t b, int64_t e) {
    for (int64_t off = b; off < e; off += chunk) {
      const int64_t len = off + chunk < e ? chunk : e - off;
      const float scale = fp8::chunk_scale(amax(s + off * ssz, len), maxv);
      scales[off / chunk] = scale;
      enc(s + off * ssz, q + off, len, 1.0f / scale);
    }
  });
}

void dequantize_fp8(const uint8_t* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* dst,
                    DType dst_dtype) {
  fmt_max(fmt);
  const Fmt df = wide_fmt(dst_dtype, "dequantize destination");
  check_chunk(chunk);
  if (n <= 0) return;
  auto dec = active_table().convert[static_cast<int>(fmt == DType::kFloat8E4M3 ? Fmt::kE4M3 : Fmt::kE5M2)]
                                   [static_cast<int>(df)];
  const size_t dsz = dtype_size(dst_dtype);
  char* d = static_cast<char*>(dst);
  parallel_for(n, chunk, 1 + dsz, [&](int64_t b, int64_t e) {
    for (int64_t off = b; off < e; off += chunk) {
      const int64_t len = off + chunk < e ? chunk : e - off;
      dec(q + off, d + off * dsz, len, scales[off / chunk]);
    }
  });
}

void dequantize_accumulate(const uint8_t* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* acc,
                           DType acc_dtype, ReduceOp op) {
  fmt_max(fmt);
  const Fmt af = wide_fmt(acc_dtype, "accumulator");
  FOp fop;
  HCOMM_CHECK_ARG(to_fop(op, &fop), std::string("dequantize_accumulate: op ") + reduce_op_name(op) +
                                        " is not supported (sum/avg/product/min/max)");
  check_chunk(chunk);
  if (n <= 0) return;
  const Fmt qf = fmt == DType::kFloat8E4M3 ? Fmt::kE4M3 : Fmt::kE5M2;
  auto fn = active_table().accumulate[static_cast<int>(af)][static_cast<int>(qf)][static_cast<int>(fop)];
  const size_t asz = dtype_size(acc_dtype);
  char* a = static_cast<char*>(acc);
  parallel_for(n, chunk, 1 + 2 * asz, [&](int64_t b, int64_t e) {
    for (int64_t off = b; off < e; off += chunk) {
      const int64_t len = off + chunk < e ? chunk : e - off;
      fn(a + off * asz, q + off, len, scales[off / chunk]);
    }
  });
}

}  // namespace kernels
}  // namespace hcomm
