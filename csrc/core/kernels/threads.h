// Splitting large kernel calls across cores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace hcomm {
namespace kernels {

// Calls below this many bytes (read + written) run on the caller's thread:
// under ~1 MiB the hand-off costs more than a second core gains.
constexpr size_t kParallelMinBytes = size_t(1) << 20;
// Pieces (grains, handed out to the threads as they come free) are at
// least this large.
constexpr size_t kParallelGrainBytes = size_t(256) << 10;

// Threads one call may use, the caller included: HCOMM_KERNEL_THREADS when
// set to a positive number, else std::thread::hardware_concurrency().
int kernel_threads();

// Runs fn(begin, end) over disjoint pieces covering [0, n); piece
// boundaries are multiples of `align` elements (chunks of a quantized
// buffer stay whole).  `bytes_per_elem` is what one element costs in memory
// traffic, for the thresholds above.  Runs on the caller alone when small,
// or when the shared helper pool is busy with other callers: helpers are
// reserved, never queued, so communicator worker threads calling kernels at
// the same time share the cores instead of oversubscribing them, and no
// call waits behind another's work.  Exceptions from fn are rethrown here.
void parallel_for(int64_t n, int64_t align, size_t bytes_per_elem,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace kernels
}  // namespace hcomm
