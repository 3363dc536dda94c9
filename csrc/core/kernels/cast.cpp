// cast(): one pass through the dispatched convert kernels (isa.h).
#include "core/kernels/cast.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "core/kernels/isa.h"
#include "core/kernels/threads.h"

namespace hcomm {
namespace kernels {

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n <= 0) return;
  Fmt sf, df;
  HCOMM_CHECK_ARG(to_fmt(src_dtype, &sf) && to_fmt(dst_dtype, &df),
                  std::string("cast from ") + dtype_name(src_dtype) + " to " + dtype_name(dst_dtype) +
                      " is not supported (float32/bfloat16/float16/float8 only)");
  const size_t ssz = dtype_size(src_dtype), dsz = dtype_size(dst_dtype);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  if (src_dtype == dst_dtype) {
    parallel_for(n, 64, 2 * ssz, [&](int64_t b, int64_t e) { std::memcpy(d + b * dsz, s + b * ssz, (e - b) * ssz); });
    return;
  }
  // Outputs this large would not stay in the caches anyway (32 MiB of L3 on
  // the dev box; glibc's memcpy switches near 3/4 of it): non-temporal
  // stores skip each line's read-for-ownership, 1.25-1.35x on a 64 MiB cast
  // there.  Smaller outputs keep regular stores, so a consumer finds them cached.
  constexpr int64_t kStreamMinBytes = int64_t(16) << 20;
  const KernelTable& table = active_table();
  const auto& kernels = n * static_cast<int64_t>(dsz) >= kStreamMinBytes ? table.convert_stream : table.convert;
  auto fn = kernels[static_cast<int>(sf)][static_cast<int>(df)];
  parallel_for(n, 64, ssz + dsz, [&](int64_t b, int64_t e) { fn(s + b * ssz, d + b * dsz, e - b, 1.0f); });
}

}  // namespace kernels
}  // namespace hcomm
