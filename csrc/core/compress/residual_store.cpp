#include "core/compress/residual_store.h"

namespace hcomm {
namespace compress {

std::shared_ptr<Residual> ResidualStore::get(const std::string& group, int64_t buffer_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = residuals_[{group, buffer_id}];
  if (!slot) slot = std::make_shared<Residual>();
  return slot;
}

void ResidualStore::clear(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = residuals_.begin(); it != residuals_.end();) {
    if (it->first.first == group) it = residuals_.erase(it);
    else ++it;
  }
}

void ResidualStore::clear_all() {
  std::lock_guard<std::mutex> lock(mu_);
  residuals_.clear();
}

size_t ResidualStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return residuals_.size();
}

}  // namespace compress
}  // namespace hcomm
