// Futex wrappers and wrapping copies for the shared-memory rings (ring.h).
#include "core/shm/ring.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <ctime>

namespace hcomm {
namespace shm {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}


// Copies n bytes out of (or into) a ring at stream position pos, wrapping.
void copy_from_ring(RingHeader* ring, size_t cap, uint64_t pos, void* dst, size_t n) {
  const size_t at = static_cast<size_t>(pos % cap), first = std::min(n, cap - at);
  if (dst != nullptr) {
    std::memcpy(dst, shm::ring_data(ring) + at, first);
    if (n > first) std::memcpy(static_cast<char*>(dst) + first, shm::ring_data(ring), n - first);
  }
}

void copy_into_ring(RingHeader* ring, size_t cap, uint64_t pos, const void* src, size_t n) {
  const size_t at = static_cast<size_t>(pos % cap), first = std::min(n, cap - at);
  std::memcpy(shm::ring_data(ring) + at, src, first);
  if (n > first) std::memcpy(shm::ring_data(ring), static_cast<const char*>(src) + first, n - first);
}

}  // namespace shm
}  // namespace hcomm
