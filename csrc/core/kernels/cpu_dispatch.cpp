// Run-time ISA selection.  HCOMM_KERNEL_ISA is read on every call (a getenv
// costs well under a microsecond, far below any kernel worth dispatching)
// so tests and benchmarks can switch paths inside one process.
#include <cstdlib>
#include <cstring>

#include "core/kernels/isa.h"

namespace hcomm {
namespace kernels {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    default: return "portable";
  }
}

bool isa_supported(Isa isa) {
  if (isa == Isa::kPortable) return true;
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  return isa == Isa::kAvx2 ? avx2 : avx512;
#else
  return false;
#endif
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kPortable;
}

Isa active_isa() {
  Isa isa = best_isa();
  const char* env = std::getenv("HCOMM_KERNEL_ISA");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return isa;
  Isa want = Isa::kAvx512;
  if (std::strcmp(env, "portable") == 0) want = Isa::kPortable;
  else if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
  return static_cast<int>(want) < static_cast<int>(isa) ? want : isa;
}

const KernelTable& active_table() {
#if defined(__x86_64__) || defined(_M_X64)
  switch (active_isa()) {
    case Isa::kAvx512: return avx512_table();
    case Isa::kAvx2: return avx2_table();
    default: break;
  }
#endif
  return portable_table();
}

bool to_fmt(DType dtype, Fmt* fmt) {
  switch (dtype) {
    case DType::kFloat32: *fmt = Fmt::kF32; return true;
    case DType::kBFloat16: *fmt = Fmt::kBF16; return true;
    case DType::kFloat16: *fmt = Fmt::kF16; return true;
    case DType::kFloat8E4M3: *fmt = Fmt::kE4M3; return true;
    case DType::kFloat8E5M2: *fmt = Fmt::kE5M2; return true;
    default: return false;
  }
}

bool to_fop(ReduceOp op, FOp* fop) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: *fop = FOp::kSum; return true;
    case ReduceOp::kProduct: *fop = FOp::kProd; return true;
    case ReduceOp::kMin: *fop = FOp::kMin; return true;
    case ReduceOp::kMax: *fop = FOp::kMax; return true;
    default: return false;
  }
}

}  // namespace kernels
}  // namespace hcomm
