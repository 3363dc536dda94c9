#include "core/stage/copy_engine.h"

#include <algorithm>
#include <array>

namespace hcomm {
namespace stage {

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    if (engine_ && data_) engine_->give_back(data_, capacity_);
    engine_ = o.engine_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.engine_ = nullptr;
    o.data_ = nullptr;
    o.capacity_ = 0;
  }
  return *this;
}

HostBlock::~HostBlock() {
  if (engine_ && data_) engine_->give_back(data_, capacity_);
}

CopyEngine::~CopyEngine() = default;

void CopyEngine::release_pool() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (auto& [capacity, p] : free_) free_host(p);
  free_.clear();
}

HostBlock CopyEngine::host_block(size_t bytes) {
  if (bytes == 0) return HostBlock(this, nullptr, 0);
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    // Smallest free block that fits.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && (best == free_.end() || it->first < best->first)) best = it;
    if (best != free_.end()) {
      HostBlock b(this, best->second, best->first);
      free_.erase(best);
      return b;
    }
  }
  // Round up to 64 KiB so nearby sizes share blocks from op to op.
  const size_t capacity = (bytes + (64u << 10) - 1) / (64u << 10) * (64u << 10);
  return HostBlock(this, allocate_host(capacity), capacity);
}

void CopyEngine::give_back(void* data, size_t capacity) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  free_.emplace_back(capacity, data);
}

void CopyEngine::count_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  bytes_moved_ += bytes;
}

uint64_t CopyEngine::bytes_moved() const {
  std::lock_guard<std::mutex> lock(pool_mu_);
  return bytes_moved_;
}

namespace {
struct Table {
  std::mutex mu;
  std::array<EngineFactory, 3> factories{};
  std::array<std::shared_ptr<CopyEngine>, 3> engines{};
};
Table& table() {
  static Table* t = new Table();  // never destroyed: engines may outlive static teardown order
  return *t;
}
}  // namespace

bool register_engine(DeviceKind device, EngineFactory factory) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.factories[static_cast<int>(device)] = factory;
  return true;
}

std::shared_ptr<CopyEngine> engine_for(DeviceKind device) {
  if (device == DeviceKind::kCPU) return emulated_engine();
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  const int i = static_cast<int>(device);
  if (!t.engines[i] && t.factories[i]) t.engines[i] = t.factories[i]();
  return t.engines[i];
}

const char* device_name(DeviceKind device) {
  switch (device) {
    case DeviceKind::kCPU: return "cpu";
    case DeviceKind::kCUDA: return "cuda";
    case DeviceKind::kNPU: return "npu";
  }
  return "?";
}

}  // namespace stage
}  // namespace hcomm
