// Error-feedback residuals, one per (group, buffer id).  The buffer id is
// whatever stays stable across steps for the same logical buffer (a DDP
// bucket index, a parameter's id); residuals of a destroyed group are
// dropped with clear(group).  Thread-safe; a Residual itself must be used by
// one thread at a time (the op that owns the buffer).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/compress/codec.h"

namespace hcomm {
namespace compress {

class ResidualStore {
 public:
  std::shared_ptr<Residual> get(const std::string& group, int64_t buffer_id);
  void clear(const std::string& group);
  void clear_all();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<Residual>> residuals_;
};

}  // namespace compress
}  // namespace hcomm
