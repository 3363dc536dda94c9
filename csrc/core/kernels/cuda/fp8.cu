// Per-chunk scaled fp8 on the GPU (semantics in quantize.h).  One block
// works on one chunk at a time (grid-stride over chunks): quantize reads the
// chunk twice, once for its amax and once to encode, and the second read
// hits L1/L2; dequantize loads the chunk's scale once instead of dividing
// every index by the chunk size.
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/cuda/launch.h"

namespace hcomm {
namespace kernels {
namespace {

constexpr int kChunkThreads = 128;  // x 8-element packs = 1024, the default chunk

__device__ __forceinline__ float finite_abs(float x) {
  float a = fabsf(x);
  return a <= 3.40282347e38f ? a : 0.0f;  // NaN and inf do not set the scale
}

// Max over the block; blockDim.x is a multiple of 32.
__device__ float block_max(float v) {
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_max[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) warp_max[0] = v;
  }
  __syncthreads();
  v = warp_max[0];
  __syncthreads();  // warp_max is reused by the next chunk
  return v;
}

// `vec`: chunk % 8 == 0 and both pointers pack-aligned, so every chunk
// starts on a pack boundary.
template <Fmt S, Fmt Q>
__global__ void __launch_bounds__(kChunkThreads)
    quantize_kernel(const void* src, uint8_t* q, float* scales, int64_t n, int64_t chunk, float fmt_max, bool vec) {
  using ST = typename cuda::Raw<S>::type;
  const ST* s = static_cast<const ST*>(src);
  for (int64_t c = blockIdx.x; c * chunk < n; c += gridDim.x) {
    const int64_t off = c * chunk;
    const int64_t len = n - off < chunk ? n - off : chunk;
    const int64_t npack = vec ? len / cuda::kPack : 0;
    float m = 0.0f;
    for (int64_t j = threadIdx.x; j < npack; j += blockDim.x) {
      const cuda::Pack<S> p = reinterpret_cast<const cuda::Pack<S>*>(s + off)[j];
#pragma unroll
      for (int k = 0; k < cuda::kPack; ++k) m = fmaxf(m, finite_abs(cuda::to_f32<S>(p.v[k])));
    }
    for (int64_t i = npack * cuda::kPack + threadIdx.x; i < len; i += blockDim.x)
      m = fmaxf(m, finite_abs(cuda::to_f32<S>(s[off + i])));
    const float scale = fp8::chunk_scale(block_max(m), fmt_max);
    const float inv = __fdiv_rn(1.0f, scale);
    if (threadIdx.x == 0) scales[c] = scale;
    for (int64_t j = threadIdx.x; j < npack; j += blockDim.x)
      cuda::pack<Q, S, cuda::kAssign, true>(q + off, s + off, j, inv);
    for (int64_t i = npack * cuda::kPack + threadIdx.x; i < len; i += blockDim.x)
      cuda::one<Q, S, cuda::kAssign, true>(q + off, s + off, i, inv);
  }
}

// dst[i] = dst[i] OP fp32(q[i]) * scale (OP = kAssign: plain dequantize).
template <Fmt D, Fmt Q, int OP>
__global__ void __launch_bounds__(kChunkThreads)
    dequant_kernel(const uint8_t* q, const float* scales, int64_t n, int64_t chunk, void* dst, bool vec) {
  using DT = typename cuda::Raw<D>::type;
  DT* d = static_cast<DT*>(dst);
  for (int64_t c = blockIdx.x; c * chunk < n; c += gridDim.x) {
    const int64_t off = c * chunk;
    const int64_t len = n - off < chunk ? n - off : chunk;
    const int64_t npack = vec ? len / cuda::kPack : 0;
    const float scale = scales[c];
    for (int64_t j = threadIdx.x; j < npack; j += blockDim.x) cuda::pack<D, Q, OP, true>(d + off, q + off, j, scale);
    for (int64_t i = npack * cuda::kPack + threadIdx.x; i < len; i += blockDim.x)
      cuda::one<D, Q, OP, true>(d + off, q + off, i, scale);
  }
}

Fmt fp8_fmt(DType fmt, float* maxv) {
  HCOMM_CHECK_ARG(fmt == DType::kFloat8E4M3 || fmt == DType::kFloat8E5M2,
                  std::string("cuda fp8: format must be float8_e4m3fn or float8_e5m2, got ") + dtype_name(fmt));
  if (maxv) *maxv = fmt == DType::kFloat8E4M3 ? fp8::kE4M3Max : fp8::kE5M2Max;
  return fmt == DType::kFloat8E4M3 ? Fmt::kE4M3 : Fmt::kE5M2;
}

Fmt wide(DType dtype, const char* what) {
  Fmt f;
  HCOMM_CHECK_ARG(to_fmt(dtype, &f) && static_cast<int>(f) < kNumAccFmt,
                  std::string("cuda fp8: ") + what + " dtype must be float32/bfloat16/float16, got " + dtype_name(dtype));
  return f;
}

void check_chunk(int64_t chunk) {
  HCOMM_CHECK_ARG(chunk > 0, "cuda fp8: chunk must be positive, got " + std::to_string(chunk));
}

template <Fmt W>
bool chunk_vec(const void* wide_ptr, const void* q, int64_t chunk) {
  return chunk % cuda::kPack == 0 && cuda::pack_aligned<W>(wide_ptr) && cuda::pack_aligned<Fmt::kE4M3>(q);
}

int chunk_grid(int64_t n, int64_t chunk) {
  // One block per chunk; 16 resident 128-thread blocks fill an SM.
  return cuda::grid_for((n + chunk - 1) / chunk, 1, 16);
}

}  // namespace

void cuda_quantize_fp8(const void* src, DType src_dtype, int64_t n, DType fmt, int64_t chunk, void* q, float* scales,
                       void* stream) {
  float maxv = 0;
  const Fmt qf = fp8_fmt(fmt, &maxv);
  const Fmt sf = wide(src_dtype, "source");
  check_chunk(chunk);
  if (n <= 0) return;
  cuda::with_wide_fmt(sf, [&](auto s) {
    constexpr Fmt S = decltype(s)::value;
    const bool vec = chunk_vec<S>(src, q, chunk);
    auto* out = static_cast<uint8_t*>(q);
    if (qf == Fmt::kE4M3)
      quantize_kernel<S, Fmt::kE4M3><<<chunk_grid(n, chunk), kChunkThreads, 0, cuda::as_stream(stream)>>>(
          src, out, scales, n, chunk, maxv, vec);
    else
      quantize_kernel<S, Fmt::kE5M2><<<chunk_grid(n, chunk), kChunkThreads, 0, cuda::as_stream(stream)>>>(
          src, out, scales, n, chunk, maxv, vec);
  });
  cuda::check_launch("cuda_quantize_fp8");
}

namespace {
template <int OP>
void launch_dequant(const void* q, const float* scales, int64_t n, Fmt qf, int64_t chunk, void* dst, Fmt df,
                    void* stream, const char* what) {
  cuda::with_wide_fmt(df, [&](auto d) {
    constexpr Fmt D = decltype(d)::value;
    const bool vec = chunk_vec<D>(dst, q, chunk);
    auto* in = static_cast<const uint8_t*>(q);
    if (qf == Fmt::kE4M3)
      dequant_kernel<D, Fmt::kE4M3, OP><<<chunk_grid(n, chunk), kChunkThreads, 0, cuda::as_stream(stream)>>>(
          in, scales, n, chunk, dst, vec);
    else
      dequant_kernel<D, Fmt::kE5M2, OP><<<chunk_grid(n, chunk), kChunkThreads, 0, cuda::as_stream(stream)>>>(
          in, scales, n, chunk, dst, vec);
  });
  cuda::check_launch(what);
}
}  // namespace

void cuda_dequantize_fp8(const void* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* dst,
                         DType dst_dtype, void* stream) {
  const Fmt qf = fp8_fmt(fmt, nullptr);
  const Fmt df = wide(dst_dtype, "destination");
  check_chunk(chunk);
  if (n <= 0) return;
  launch_dequant<cuda::kAssign>(q, scales, n, qf, chunk, dst, df, stream, "cuda_dequantize_fp8");
}

void cuda_dequantize_accumulate(const void* q, const float* scales, int64_t n, DType fmt, int64_t chunk, void* acc,
                                DType acc_dtype, ReduceOp op, void* stream) {
  const Fmt qf = fp8_fmt(fmt, nullptr);
  const Fmt af = wide(acc_dtype, "accumulator");
  FOp fop;
  HCOMM_CHECK_ARG(to_fop(op, &fop), std::string("cuda_dequantize_accumulate: op ") + reduce_op_name(op) +
                                        " is not supported (sum/avg/product/min/max)");
  check_chunk(chunk);
  if (n <= 0) return;
  cuda::with_fop(fop, [&](auto o) {
    launch_dequant<decltype(o)::value>(q, scales, n, qf, chunk, acc, af, stream, "cuda_dequantize_accumulate");
  });
}

}  // namespace kernels
}  // namespace hcomm
