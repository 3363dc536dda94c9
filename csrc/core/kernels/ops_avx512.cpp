// The AVX-512 kernel table (16 fp32 lanes, mask registers for selects).
// Compiled for avx512f/bw/vl by the pragma below, called only when the CPU
// has them (cpu_dispatch.cpp).  bf16 is rounded with integer arithmetic, not
// with AVX512-BF16's vcvtneps2bf16: that instruction flushes denormals to
// zero, and the result must equal torch's (and the other paths') bits.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/kernels/fp8.h"
#include "core/kernels/half.h"
#include "core/kernels/isa.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c")
// avx512f brings FMA; keep products and sums separately rounded.
#pragma GCC optimize("fp-contract=off")
#endif

namespace hcomm {
namespace kernels {
namespace {

struct Avx512 {
  static constexpr int W = 16;
  using V = __m512;
  using I = __m512i;

  static I c(int v) { return _mm512_set1_epi32(v); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V min(V a, V b) {
    return _mm512_mask_add_ps(_mm512_min_ps(b, a), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), a, b);
  }
  static V max(V a, V b) {
    return _mm512_mask_add_ps(_mm512_max_ps(b, a), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), a, b);
  }
  static V amax_step(V m, V x) {
    V a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), c(0x7fffffff)));
    __mmask16 finite = _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.40282347e38f), _CMP_LE_OQ);
    return _mm512_mask_max_ps(m, finite, m, a);
  }
  static float hmax(V m) { return _mm512_reduce_max_ps(m); }

  template <Fmt F>
  static V load(const void* p, int64_t i) {
    if constexpr (F == Fmt::kF32) {
      return _mm512_loadu_ps(static_cast<const float*>(p) + i);
    } else if constexpr (F == Fmt::kBF16) {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else if constexpr (F == Fmt::kF16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
    } else if constexpr (F == Fmt::kE4M3) {
      I b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(p) + i)));
      I sign = _mm512_slli_epi32(_mm512_and_si512(b, c(0x80)), 24);
      I a = _mm512_and_si512(b, c(0x7f));
      I r = _mm512_add_epi32(_mm512_slli_epi32(a, 20), c(120 << 23));
      I sub = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(0.001953125f)));
      r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(a, c(8)), sub);
      r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(a, c(0x7f)), c(0x7fc00000));
      return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
    } else {  // e5m2: the top byte of a half
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(p) + i));
      return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
    }
  }

  // W values of format F packed into one register (64, 32 or 16 bytes).
  template <Fmt F>
  __attribute__((always_inline)) static auto pack(V v) {
    if constexpr (F == Fmt::kF32) {
      return v;
    } else if constexpr (F == Fmt::kBF16) {
      I u = _mm512_castps_si512(v);
      __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, c(0x7fffffff)), c(0x7f800000));
      I lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), c(1));
      I r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(c(0x7fff), lsb)), 16);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), c(0x40)));
      return _mm512_cvtepi32_epi16(r);
    } else if constexpr (F == Fmt::kF16) {
      return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
      // Same steps as fp8::float_to_e4m3/e5m2, on 16 lanes.
      constexpr bool e4 = F == Fmt::kE4M3;
      I u = _mm512_castps_si512(v);
      I sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), c(0x80));
      I a = _mm512_and_si512(u, c(0x7fffffff));
      __mmask16 nan = _mm512_cmpgt_epi32_mask(a, c(e4 ? 0x7f7fffff : 0x7f800000));
      __mmask16 inf = _mm512_cmpeq_epi32_mask(a, c(0x7f800000));
      a = _mm512_min_epi32(a, c(e4 ? 0x43e00000 : 0x47600000));
      const int shift = e4 ? 20 : 21;
      I sub = _mm512_sub_epi32(
          _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(e4 ? 16384.0f : 128.0f))),
          c(e4 ? 0x46800000 : 0x43000000));
      I lsb = _mm512_and_si512(_mm512_srli_epi32(a, shift), c(1));
      I rnd = _mm512_add_epi32(_mm512_add_epi32(a, c((1 << (shift - 1)) - 1)), lsb);
      I r = _mm512_sub_epi32(_mm512_srli_epi32(rnd, shift), c(e4 ? (120 << 3) : (112 << 2)));
      r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(a, c(e4 ? 0x3c800000 : 0x38800000)), sub);
      if (!e4) r = _mm512_mask_mov_epi32(r, inf, c(0x7c));
      r = _mm512_mask_mov_epi32(r, nan, c(0x7f));
      return _mm512_cvtepi32_epi8(_mm512_or_si512(r, sign));
    }
  }

  // kNT: non-temporal stores (simd_body.h, for outputs far larger than the
  // caches): they skip the read-for-ownership of each destination line,
  // which a memory-bound cast pays on every byte it writes.  p + i must then
  // be aligned to the register's width (W values of F); fence() after the last.
  template <Fmt F, bool kNT>
  __attribute__((always_inline)) static void put(void* p, int64_t i, V v) {
    auto r = pack<F>(v);
    char* d = static_cast<char*>(p) + i * fmt_bytes<F>();
    if constexpr (F == Fmt::kF32) kNT ? _mm512_stream_ps(reinterpret_cast<float*>(d), r)
                                      : _mm512_storeu_ps(reinterpret_cast<float*>(d), r);
    else if constexpr (sizeof(r) == 32) kNT ? _mm256_stream_si256(reinterpret_cast<__m256i*>(d), r)
                                            : _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), r);
    else kNT ? _mm_stream_si128(reinterpret_cast<__m128i*>(d), r) : _mm_storeu_si128(reinterpret_cast<__m128i*>(d), r);
  }
  template <Fmt F>
  __attribute__((always_inline)) static void store(void* p, int64_t i, V v) { put<F, false>(p, i, v); }
  static constexpr bool kStream = true;
  template <Fmt F>
  __attribute__((always_inline)) static void stream(void* p, int64_t i, V v) { put<F, true>(p, i, v); }
  static void fence() { _mm_sfence(); }
};

#include "core/kernels/simd_body.h"

}  // namespace

const KernelTable& avx512_table() {
  static const KernelTable table = make_table<Avx512>("avx512");
  return table;
}

}  // namespace kernels
}  // namespace hcomm

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // x86-64
