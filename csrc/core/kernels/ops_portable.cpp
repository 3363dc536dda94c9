// The portable kernel table: one lane of plain C++, correct on any CPU
// (x86-64 baseline, aarch64, ...).  It is also the reference the vector
// tables are tested against, through the same tests.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/kernels/fp8.h"
#include "core/kernels/half.h"
#include "core/kernels/isa.h"

namespace hcomm {
namespace kernels {
namespace {

struct Scalar {
  static constexpr int W = 1;
  static constexpr bool kStream = false;  // no non-temporal path (simd_body.h)
  using V = float;
  template <Fmt F> static V load(const void* p, int64_t i);
  template <Fmt F> static void store(void* p, int64_t i, V v);
  static V set1(float f) { return f; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V min(V a, V b) { return (a != a || b != b) ? a + b : (b < a ? b : a); }
  static V max(V a, V b) { return (a != a || b != b) ? a + b : (b > a ? b : a); }
  static V amax_step(V m, V x) {
    float a = bits_to_float(float_to_bits(x) & 0x7fffffffu);
    return (a <= 3.40282347e38f && a > m) ? a : m;
  }
  static float hmax(V m) { return m; }
};

#include "core/kernels/simd_body.h"

template <Fmt F> Scalar::V Scalar::load(const void* p, int64_t i) { return sload<F>(p, i); }
template <Fmt F> void Scalar::store(void* p, int64_t i, V v) { sstore<F>(p, i, v); }

}  // namespace

const KernelTable& portable_table() {
  static const KernelTable table = make_table<Scalar>("portable");
  return table;
}

}  // namespace kernels
}  // namespace hcomm
