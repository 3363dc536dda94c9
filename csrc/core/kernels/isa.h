// CPU kernel variants and the run-time choice between them.
//
// Each ISA's kernels live in their own translation unit (ops_portable.cpp,
// ops_avx2.cpp, ops_avx512.cpp) compiled from one body (simd_body.h) and
// exported as a table of function pointers.  The choice is made per call
// from __builtin_cpu_supports and HCOMM_KERNEL_ISA, so one binary runs
// everywhere and tests can force each path.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace hcomm {
namespace kernels {

enum class Isa : int { kPortable = 0, kAvx2, kAvx512 };

// The element formats the vector kernels load and store.  Every kernel goes
// through fp32 lanes: fp16/bf16 are widened, accumulated in fp32 and rounded
// once on store.
enum class Fmt : int { kF32 = 0, kBF16, kF16, kE4M3, kE5M2, kCount };
constexpr int kNumFmt = static_cast<int>(Fmt::kCount);
constexpr int kNumAccFmt = 3;  // accumulators: f32, bf16, f16

// Bytes per element of a format.
template <Fmt F>
constexpr int64_t fmt_bytes() {
  return F == Fmt::kF32 ? 4 : (F == Fmt::kBF16 || F == Fmt::kF16) ? 2 : 1;
}

// Reduce ops the float kernels implement; kAvg reduces as kSum.
enum class FOp : int { kSum = 0, kProd, kMin, kMax, kCount };
constexpr int kNumFOp = static_cast<int>(FOp::kCount);

struct KernelTable {
  const char* name;
  // dst[i] = to_D(from_S(src[i]) * mul); mul == 1 skips the multiply.
  void (*convert[kNumFmt][kNumFmt])(const void* src, void* dst, int64_t n, float mul);
  // The same with non-temporal stores where the ISA has them (AVX-512), for
  // outputs far larger than the caches (cast.cpp decides); else = convert.
  void (*convert_stream[kNumFmt][kNumFmt])(const void* src, void* dst, int64_t n, float mul);
  // acc[i] = acc[i] OP (from_S(src[i]) * mul), acc of format A < kNumAccFmt.
  void (*accumulate[kNumAccFmt][kNumFmt][kNumFOp])(void* acc, const void* src, int64_t n, float mul);
  // Largest finite |src[i]| (0 for none), src f32/bf16/f16.
  float (*amax[kNumAccFmt])(const void* src, int64_t n);
};

const KernelTable& portable_table();
#if defined(__x86_64__) || defined(_M_X64)
const KernelTable& avx2_table();
const KernelTable& avx512_table();
#endif

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);  // the CPU can run it
Isa best_isa();               // the best the CPU can run
// best_isa() unless HCOMM_KERNEL_ISA names a lower one; a request the CPU
// cannot honour falls back to the best it can (active_isa() tells which).
Isa active_isa();
const KernelTable& active_table();

// Maps a DType to the kernels' format; returns false for other dtypes.
bool to_fmt(DType dtype, Fmt* fmt);
bool to_fop(ReduceOp op, FOp* fop);

}  // namespace kernels
}  // namespace hcomm
