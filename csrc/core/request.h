// The handle an asynchronous collective returns: completion, error, and the
// record of what ran (algorithm, chunk size, time, bytes per tier).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/peer_watch.h"

namespace hcomm {

struct TierRecord {
  std::string tier;  // "flat", "intra", "inter"
  size_t bytes = 0;  // bytes this rank sent on the tier
  double seconds = 0;
};

struct OpRecord {
  uint64_t seq = 0;
  OpKind kind = OpKind::kAllReduce;
  DType dtype = DType::kFloat32;
  int64_t count = 0;
  size_t bytes = 0;
  std::string algorithm;
  size_t chunk_bytes = 0;
  double seconds = 0;            // measured on the worker, issue to completion
  double predicted_seconds = 0;  // the cost model's estimate for the chosen algorithm
  std::vector<TierRecord> tiers;
  size_t staged_bytes = 0;  // copied between device and host staging blocks (both ways)
  int source_rank = -1;  // recv from any source: who sent it
  std::string error;     // empty: the op succeeded; else the message it failed with
};

class Request {
 public:
  using Callback = std::function<void(std::exception_ptr)>;

  // Blocks up to `timeout` (negative: forever).  Returns false on timeout;
  // rethrows the op's error if it failed.
  bool wait(std::chrono::milliseconds timeout);
  bool completed() const;
  std::exception_ptr error() const;
  // Runs `cb` once the op finishes (at once, on this thread, if it already has).
  void on_complete(Callback cb);
  OpRecord record() const;
  // Who this op's rank is blocked on now ("" when unknown or nothing), for
  // timeout messages raised by whoever waits on the request.
  void set_watch(std::shared_ptr<const PeerWatch> watch);
  std::string waiting_for() const;

  // Called by the executor.
  void complete(std::exception_ptr error, const OpRecord& record);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  OpRecord record_;
  std::vector<Callback> callbacks_;
  std::shared_ptr<const PeerWatch> watch_;
};

}  // namespace hcomm
