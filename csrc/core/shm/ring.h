// The shared-memory layout of ShmTransport (shm_transport.h).
//
// Every rank owns one region, named by the group, that holds its *incoming*
// rings: one single-producer/single-consumer byte ring per source rank.  A
// sender maps the receiver's region and writes into the ring for itself; the
// receiver's progress thread is the only reader.  Counters are monotonic
// byte counts (never wrapped), so "bytes in flight" is head - tail.
//
// Sleeping uses futexes on 32-bit words in the mapping (shared, not
// FUTEX_PRIVATE: the waiters are in different processes).  A side that
// sleeps first raises its "waiting" flag, then re-checks; the other side,
// after publishing, reads the flag and wakes it.  All four accesses are
// seq_cst, so one of the two always sees the other and no wake-up is lost.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace hcomm {
namespace shm {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory rings need lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory rings need lock-free 32-bit atomics");

constexpr uint64_t kMagic = 0x68636f6d6d73686dULL;  // "hcommshm"

struct alignas(64) RingHeader {
  std::atomic<uint64_t> head;  // bytes the sender has published
  char pad0[56];
  std::atomic<uint64_t> tail;  // bytes the receiver has consumed
  char pad1[56];
  std::atomic<uint32_t> space_seq;       // futex word: bumped when the receiver frees space
  std::atomic<uint32_t> sender_waiting;  // the sender sleeps on space_seq
  char pad2[56];
};

struct alignas(64) RegionHeader {
  uint64_t magic;
  uint32_t ranks;  // sources (the owner's own slot is unused)
  uint32_t owner;
  uint64_t ring_bytes;
  char pad0[40];
  std::atomic<uint32_t> doorbell;           // futex word: bumped by senders after publishing
  std::atomic<uint32_t> receiver_sleeping;  // the owner's progress thread sleeps on doorbell
  char pad1[56];
};

// Message framing inside a ring: this header, then `bytes` of payload.
struct MessageHeader {
  int64_t tag;
  uint64_t bytes;
};

inline size_t region_bytes(int ranks, size_t ring_bytes) {
  return sizeof(RegionHeader) + static_cast<size_t>(ranks) * (sizeof(RingHeader) + ring_bytes);
}

inline RingHeader* ring_of(void* region, int source, size_t ring_bytes) {
  char* base = static_cast<char*>(region) + sizeof(RegionHeader);
  return reinterpret_cast<RingHeader*>(base + static_cast<size_t>(source) * (sizeof(RingHeader) + ring_bytes));
}

inline char* ring_data(RingHeader* ring) { return reinterpret_cast<char*>(ring + 1); }

// Copies n bytes out of (dst == nullptr: skips them) or into a ring of
// capacity cap at stream position pos, wrapping at the end.
void copy_from_ring(RingHeader* ring, size_t cap, uint64_t pos, void* dst, size_t n);
void copy_into_ring(RingHeader* ring, size_t cap, uint64_t pos, const void* src, size_t n);

// Blocks while *word == expected, at most `timeout`; spurious returns are fine.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
void futex_wake_all(std::atomic<uint32_t>* word);

}  // namespace shm
}  // namespace hcomm
