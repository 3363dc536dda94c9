// Shared device code for the CUDA kernels: per-format loads/stores through
// fp32 (the same scalar conversions as the CPU, half.h/fp8.h), 8-element
// vector packs, launch geometry and error checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/kernels/fp8.h"
#include "core/kernels/half.h"
#include "core/kernels/isa.h"

namespace hcomm {
namespace kernels {
namespace cuda {

// Pseudo-op for plain conversion: dst = src (dst is not read).
constexpr int kAssign = -1;

template <Fmt F> struct Raw { using type = float; };
template <> struct Raw<Fmt::kBF16> { using type = uint16_t; };
template <> struct Raw<Fmt::kF16> { using type = uint16_t; };
template <> struct Raw<Fmt::kE4M3> { using type = uint8_t; };
template <> struct Raw<Fmt::kE5M2> { using type = uint8_t; };

// Eight elements of format F: one 8..32-byte aligned load or store.
constexpr int kPack = 8;
template <Fmt F>
struct alignas(sizeof(typename Raw<F>::type) * kPack) Pack {
  typename Raw<F>::type v[kPack];
};

template <Fmt F>
__device__ __forceinline__ float to_f32(typename Raw<F>::type x) {
  if constexpr (F == Fmt::kF32) return x;
  else if constexpr (F == Fmt::kBF16) return bf16_to_float(x);
  else if constexpr (F == Fmt::kF16) return fp16_to_float(x);
  else if constexpr (F == Fmt::kE4M3) return fp8::e4m3_to_float(x);
  else return fp8::e5m2_to_float(x);
}

template <Fmt F>
__device__ __forceinline__ typename Raw<F>::type from_f32(float v) {
  if constexpr (F == Fmt::kF32) return v;
  else if constexpr (F == Fmt::kBF16) return float_to_bf16(v);
  else if constexpr (F == Fmt::kF16) return float_to_fp16(v);
  else if constexpr (F == Fmt::kE4M3) return fp8::float_to_e4m3(v);
  else return fp8::float_to_e5m2(v);
}

// OP applied in fp32 with explicitly rounded operations (no FMA
// contraction), matching the CPU kernels bit for bit.
template <int OP>
__device__ __forceinline__ float apply(float a, float b) {
  if constexpr (OP == static_cast<int>(FOp::kSum)) return __fadd_rn(a, b);
  else if constexpr (OP == static_cast<int>(FOp::kProd)) return __fmul_rn(a, b);
  else if constexpr (OP == static_cast<int>(FOp::kMin)) return (a != a || b != b) ? __fadd_rn(a, b) : (b < a ? b : a);
  else if constexpr (OP == static_cast<int>(FOp::kMax)) return (a != a || b != b) ? __fadd_rn(a, b) : (b > a ? b : a);
  else return b;  // kAssign
}

// One element: dst[i] = to_D(dst[i] OP from_S(src[i]) * mul).
template <Fmt D, Fmt S, int OP, bool kScaled>
__device__ __forceinline__ void one(void* dst, const void* src, int64_t i, float mul) {
  using DT = typename Raw<D>::type;
  using ST = typename Raw<S>::type;
  float s = to_f32<S>(static_cast<const ST*>(src)[i]);
  if (kScaled) s = __fmul_rn(s, mul);
  DT* d = static_cast<DT*>(dst);
  float a = OP == kAssign ? 0.0f : to_f32<D>(d[i]);
  d[i] = from_f32<D>(apply<OP>(a, s));
}

// Pack j (elements 8j..8j+7), both pointers aligned to their pack size.
template <Fmt D, Fmt S, int OP, bool kScaled>
__device__ __forceinline__ void pack(void* dst, const void* src, int64_t j, float mul) {
  const Pack<S> s = static_cast<const Pack<S>*>(src)[j];
  Pack<D>* dp = static_cast<Pack<D>*>(dst) + j;
  Pack<D> d;
  if (OP != kAssign) d = *dp;
#pragma unroll
  for (int k = 0; k < kPack; ++k) {
    float x = to_f32<S>(s.v[k]);
    if (kScaled) x = __fmul_rn(x, mul);
    float a = OP == kAssign ? 0.0f : to_f32<D>(d.v[k]);
    d.v[k] = from_f32<D>(apply<OP>(a, x));
  }
  *dp = d;
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <Fmt F>
inline bool pack_aligned(const void* p) {
  return aligned(p, sizeof(Pack<F>));
}

// Blocks to launch: enough to cover `work` items of `per_block`, capped at
// `blocks_per_sm` times the device's SMs (the kernels grid-stride past that).
int grid_for(int64_t work, int per_block, int blocks_per_sm = 8);

// Throws hcomm::Error naming `what` if the launch failed.
void check_launch(const char* what);

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Calls fn(std::integral_constant-like tag) with the Fmt as a compile-time
// value; `allowed` limits which formats instantiate code.
template <Fmt F>
struct FmtTag {
  static constexpr Fmt value = F;
};

template <class Fn>
void with_fmt(Fmt f, Fn&& fn) {
  switch (f) {
    case Fmt::kF32: fn(FmtTag<Fmt::kF32>{}); break;
    case Fmt::kBF16: fn(FmtTag<Fmt::kBF16>{}); break;
    case Fmt::kF16: fn(FmtTag<Fmt::kF16>{}); break;
    case Fmt::kE4M3: fn(FmtTag<Fmt::kE4M3>{}); break;
    case Fmt::kE5M2: fn(FmtTag<Fmt::kE5M2>{}); break;
    default: break;
  }
}

template <class Fn>
void with_wide_fmt(Fmt f, Fn&& fn) {
  switch (f) {
    case Fmt::kF32: fn(FmtTag<Fmt::kF32>{}); break;
    case Fmt::kBF16: fn(FmtTag<Fmt::kBF16>{}); break;
    case Fmt::kF16: fn(FmtTag<Fmt::kF16>{}); break;
    default: break;
  }
}

template <class Fn>
void with_fop(FOp op, Fn&& fn) {
  switch (op) {
    case FOp::kSum: fn(std::integral_constant<int, static_cast<int>(FOp::kSum)>{}); break;
    case FOp::kProd: fn(std::integral_constant<int, static_cast<int>(FOp::kProd)>{}); break;
    case FOp::kMin: fn(std::integral_constant<int, static_cast<int>(FOp::kMin)>{}); break;
    case FOp::kMax: fn(std::integral_constant<int, static_cast<int>(FOp::kMax)>{}); break;
    default: break;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace hcomm
