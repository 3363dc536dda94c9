// The AVX2 + F16C kernel table (8 fp32 lanes).  Every function in this file
// is compiled for avx2/f16c by the pragma below rather than by a per-file
// compiler flag, so setup.py needs no special cases and the same binary runs
// on CPUs without AVX2 (cpu_dispatch.cpp only calls in here when the CPU has
// it).  FMA is deliberately not enabled: a fused multiply-add would make
// dequantize-accumulate round differently from the other paths.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/kernels/fp8.h"
#include "core/kernels/half.h"
#include "core/kernels/isa.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#pragma GCC optimize("fp-contract=off")
#endif

namespace hcomm {
namespace kernels {
namespace {

struct Avx2 {
  static constexpr int W = 8;
  static constexpr bool kStream = false;  // no non-temporal path (simd_body.h)
  using V = __m256;
  using I = __m256i;

  static I c(int v) { return _mm256_set1_epi32(v); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V min(V a, V b) {
    V r = _mm256_min_ps(b, a);  // b < a ? b : a
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static V max(V a, V b) {
    V r = _mm256_max_ps(b, a);  // b > a ? b : a
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static V amax_step(V m, V x) {
    V a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(x), c(0x7fffffff)));
    V finite = _mm256_cmp_ps(a, _mm256_set1_ps(3.40282347e38f), _CMP_LE_OQ);
    return _mm256_max_ps(m, _mm256_and_ps(a, finite));
  }
  static float hmax(V m) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float r = lanes[0];
    for (int k = 1; k < 8; ++k) r = lanes[k] > r ? lanes[k] : r;
    return r;
  }

  // 8 int32 lanes holding byte codes -> 8 bytes at p.
  static void store_bytes(uint8_t* p, I r) {
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }

  template <Fmt F>
  static V load(const void* p, int64_t i) {
    if constexpr (F == Fmt::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    } else if constexpr (F == Fmt::kBF16) {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else if constexpr (F == Fmt::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    } else if constexpr (F == Fmt::kE4M3) {
      I b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(p) + i)));
      I sign = _mm256_slli_epi32(_mm256_and_si256(b, c(0x80)), 24);
      I a = _mm256_and_si256(b, c(0x7f));
      I normal = _mm256_add_epi32(_mm256_slli_epi32(a, 20), c(120 << 23));
      I sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(0.001953125f)));
      I r = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(c(8), a));
      r = _mm256_blendv_epi8(r, c(0x7fc00000), _mm256_cmpeq_epi32(a, c(0x7f)));
      return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
    } else {  // e5m2: the top byte of a half
      __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(p) + i));
      return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8));
    }
  }

  template <Fmt F>
  static void store(void* p, int64_t i, V v) {
    if constexpr (F == Fmt::kF32) {
      _mm256_storeu_ps(static_cast<float*>(p) + i, v);
    } else if constexpr (F == Fmt::kBF16) {
      // Round to nearest even on the bits; NaN keeps its top bits, made quiet.
      I u = _mm256_castps_si256(v);
      I nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, c(0x7fffffff)), c(0x7f800000));
      I lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), c(1));
      I r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(c(0x7fff), lsb)), 16);
      r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), c(0x40)), nan);
      __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), w);
    } else if constexpr (F == Fmt::kF16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // Same steps as fp8::float_to_e4m3/e5m2, on 8 lanes.
      constexpr bool e4 = F == Fmt::kE4M3;
      I u = _mm256_castps_si256(v);
      I sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), c(0x80));
      I a = _mm256_and_si256(u, c(0x7fffffff));
      I nan = e4 ? _mm256_cmpgt_epi32(a, c(0x7f7fffff)) : _mm256_cmpgt_epi32(a, c(0x7f800000));
      I inf = _mm256_cmpeq_epi32(a, c(0x7f800000));
      a = _mm256_min_epi32(a, c(e4 ? 0x43e00000 : 0x47600000));
      const int shift = e4 ? 20 : 21;
      I sub = _mm256_sub_epi32(
          _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(e4 ? 16384.0f : 128.0f))),
          c(e4 ? 0x46800000 : 0x43000000));
      I lsb = _mm256_and_si256(_mm256_srli_epi32(a, shift), c(1));
      I rnd = _mm256_add_epi32(_mm256_add_epi32(a, c((1 << (shift - 1)) - 1)), lsb);
      I nrm = _mm256_sub_epi32(_mm256_srli_epi32(rnd, shift), c(e4 ? (120 << 3) : (112 << 2)));
      I r = _mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(c(e4 ? 0x3c800000 : 0x38800000), a));
      if (!e4) r = _mm256_blendv_epi8(r, c(0x7c), inf);
      r = _mm256_blendv_epi8(r, c(0x7f), nan);
      store_bytes(static_cast<uint8_t*>(p) + i, _mm256_or_si256(r, sign));
    }
  }
};

#include "core/kernels/simd_body.h"

}  // namespace

const KernelTable& avx2_table() {
  static const KernelTable table = make_table<Avx2>("avx2");
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
