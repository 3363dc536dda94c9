// Copies between a device's memory and host staging memory: the two ends of
// the host-staged bridge between islands whose libraries cannot reach each
// other's memory (NCCL to HCCL, GPU to CPU).
//
// One engine per device kind, chosen at run time from a table the device
// code fills in (cuda_engine.cu registers itself when the CUDA build links
// it); no vendor #ifdef in the callers.  The "emulated" engine moves CPU
// memory through exactly the same interface (separate staging blocks, copies
// on their own threads in issue order, completion by ticket), so every
// bridged path runs in CI without a device (HCOMM_FORCE_STAGING=1).
//
// Copies in one direction complete in issue order (one stream or thread per
// direction), and the two directions run concurrently, so a chunk going up
// overlaps the chunk coming down and the network between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/types.h"

namespace hcomm {
namespace stage {

enum class Direction : int { kToHost = 0, kToDevice = 1 };

// Names one issued copy; wait() on it.  seq counts per direction from 1.
struct Ticket {
  Direction direction = Direction::kToHost;
  uint64_t seq = 0;  // 0: nothing to wait for
};

class CopyEngine;

// Host staging memory (pinned where the device has it), returned to its
// engine's pool when dropped.
class HostBlock {
 public:
  HostBlock() = default;
  HostBlock(CopyEngine* engine, void* data, size_t capacity) : engine_(engine), data_(data), capacity_(capacity) {}
  HostBlock(HostBlock&& o) noexcept { *this = std::move(o); }
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  ~HostBlock();
  char* data() const { return static_cast<char*>(data_); }
  size_t capacity() const { return capacity_; }

 private:
  CopyEngine* engine_ = nullptr;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine();
  // "emulated", "cuda", ...
  virtual const char* name() const = 0;
  // The device memory this engine reads and writes.
  virtual DeviceKind device() const = 0;

  // Orders later copies after the work already queued on the caller's
  // stream (`stream`: the vendor's stream handle; nullptr: the default one).
  // The emulated engine has nothing queued: a no-op.
  virtual void after_stream(void* stream) { (void)stream; }
  // Asynchronous copies; `bytes` may be 0 (a ticket that is already done).
  virtual Ticket to_host(void* host, const void* device, size_t bytes) = 0;
  virtual Ticket to_device(void* device, const void* host, size_t bytes) = 0;
  // Blocks until the copy (and every earlier one in its direction) is done;
  // throws hcomm::Error when a copy failed.
  virtual void wait(const Ticket& t) = 0;

  // A staging block of at least `bytes`, from a grow-only pool: pinned
  // allocations cost milliseconds, so one op's blocks serve the next.
  HostBlock host_block(size_t bytes);
  // Copies and bytes moved since the engine started (benchmarks, records).
  uint64_t bytes_moved() const;

 protected:
  virtual void* allocate_host(size_t bytes) = 0;
  virtual void free_host(void* p) = 0;
  void count_bytes(size_t bytes);
  // Engines call this from their destructors (the pool's blocks go back
  // through free_host, which needs the derived engine alive).
  void release_pool();

 private:
  friend class HostBlock;
  void give_back(void* data, size_t capacity);
  mutable std::mutex pool_mu_;
  std::vector<std::pair<size_t, void*>> free_;  // (capacity, block)
  uint64_t bytes_moved_ = 0;
};

// The engine for `device` in this process (one per kind, made on first use),
// or nullptr when this build has none (a CUDA tensor on a CPU-only build).
std::shared_ptr<CopyEngine> engine_for(DeviceKind device);
// Device code registers its factory at load time.
using EngineFactory = std::shared_ptr<CopyEngine> (*)();
bool register_engine(DeviceKind device, EngineFactory factory);
// The CPU engine the staging mode uses (HCOMM_FORCE_STAGING).
std::shared_ptr<CopyEngine> emulated_engine();

const char* device_name(DeviceKind device);

}  // namespace stage
}  // namespace hcomm
