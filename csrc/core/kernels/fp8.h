// Scalar OCP FP8 conversions (e4m3fn and e5m2), shared by the CPU kernels'
// portable path and tails and by the CUDA kernels, so that every path
// produces the same bits (HCOMM_HD makes them __host__ __device__ in nvcc).
//
// Encoding semantics (float -> fp8), chosen once for every path:
//  * round to nearest, ties to even;
//  * finite values beyond the format's largest finite value saturate to it
//    (OCP "satfinite"), because a per-chunk scale rounded in fp32 can push
//    the chunk's largest element a hair past the limit and error feedback
//    can add a residual on top;
//  * non-finite inputs stay non-finite: NaN -> NaN (0x7f | sign) in both
//    formats, +-inf -> +-inf in e5m2 and -> NaN in e4m3 (which has no inf).
//    Saturating inf would hide an overflow from loss scalers that check the
//    reduced gradients for inf/NaN.
// torch 2.13's CPU `.to(float8_e4m3fn)` also saturates finite values but
// turns +-inf into +-448; its e5m2 cast overflows finite values to inf.  For
// finite inputs (and NaN) our e4m3 bits equal torch's; tests pin both
// differences (tests/kernels/test_cast.py).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/kernels/half.h"  // float_to_bits / bits_to_float
#include "core/kernels/hd.h"

namespace hcomm {
namespace kernels {
namespace fp8 {

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
// Smallest scale a chunk gets: keeps 1/scale finite for all-tiny chunks.
constexpr float kMinScale = 1.17549435e-38f;  // 2^-126, FLT_MIN

// Both encoders work on the magnitude's bit pattern: for non-negative floats
// the integer order of the bits is the numeric order, so clamping is an
// integer min.  Subnormal results use the float-add trick: adding 2^k whose
// ulp equals the fp8 subnormal step makes the FPU do the round-to-even, and
// the sum's low mantissa bits are the fp8 code (a result of 8 resp. 4 is the
// smallest normal, which is also the right code).
HCOMM_HD uint8_t float_to_e4m3(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN, inf
  if (a > 0x43e00000u) a = 0x43e00000u;                              // satfinite: 448
  uint32_t r;
  if (a < 0x3c800000u) {  // below 2^-6: subnormal, step 2^-9 (ulp of 2^14)
    r = float_to_bits(bits_to_float(a) + 16384.0f) - 0x46800000u;
  } else {  // drop 20 mantissa bits with round-to-even, rebias 127 -> 7
    r = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  }
  return static_cast<uint8_t>(sign | r);
}

HCOMM_HD uint8_t float_to_e5m2(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | 0x7cu);  // inf
  if (a > 0x47600000u) a = 0x47600000u;                               // satfinite: 57344
  uint32_t r;
  if (a < 0x38800000u) {  // below 2^-14: subnormal, step 2^-16 (ulp of 2^7)
    r = float_to_bits(bits_to_float(a) + 128.0f) - 0x43000000u;
  } else {  // drop 21 mantissa bits with round-to-even, rebias 127 -> 15
    r = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2);
  }
  return static_cast<uint8_t>(sign | r);
}

// Decoding is exact.  e4m3: normal codes move the 7 magnitude bits into the
// float's exponent/mantissa and rebias; subnormal codes are m * 2^-9, built
// with an int->float conversion so no float denormal is ever touched (DAZ
// would zero it); 0x7f/0xff are the only NaNs.
HCOMM_HD float e4m3_to_float(uint8_t b) {
  uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  uint32_t a = b & 0x7fu;
  uint32_t r;
  if (a == 0x7fu) r = 0x7fc00000u;
  else if (a < 8u) r = float_to_bits(static_cast<float>(a) * 0.001953125f);  // 2^-9
  else r = (a << 20) + (120u << 23);
  return bits_to_float(sign | r);
}

// e5m2 is the top byte of an IEEE half; decode it the same way.
HCOMM_HD float e5m2_to_float(uint8_t b) {
  uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  uint32_t a = b & 0x7fu;
  uint32_t r;
  if (a >= 0x7cu) r = 0x7f800000u | ((a & 3u) << 21) | (a > 0x7cu ? 0x00400000u : 0u);
  else if (a < 4u) r = float_to_bits(static_cast<float>(a) * 1.52587890625e-05f);  // 2^-16
  else r = (a << 21) + (112u << 23);
  return bits_to_float(sign | r);
}

// The per-chunk scale for a chunk whose largest finite magnitude is `amax`:
// encode multiplies by 1/scale, decode by scale.
HCOMM_HD float chunk_scale(float amax, float fmt_max) {
  float s = amax / fmt_max;
  return s > kMinScale ? s : kMinScale;
}

}  // namespace fp8
}  // namespace kernels
}  // namespace hcomm
