// The vendor adapter over any torch c10d::Backend: gloo now, torch's NCCL on
// CUDA builds, torch_npu's HCCL where installed.  The backend is created in
// Python (the wheel ships no gloo headers) over its own PrefixStore and handed
// here; this class only translates core calls into c10d calls and waits.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>

#include "core/transport.h"

namespace hcomm {

class C10dTransport final : public Transport {
 public:
  C10dTransport(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string library() const override { return library_; }
  bool supports(const CollectiveArgs& args) const override;
  void run(const CollectiveArgs& args) override;
  bool start(const CollectiveArgs& args, std::function<void(std::exception_ptr)> done) override;
  std::unique_ptr<Pending> isend(const Buffer& buf, int peer, int tag) override;
  std::unique_ptr<Pending> irecv(const Buffer& buf, int peer, int tag) override;
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(timeout_ms_.load()); }
  // ProcessGroupHComm::setTimeout (torch's _set_pg_timeout): later ops use it.
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ms_.store(timeout.count()); }
  const c10::intrusive_ptr<c10d::Backend>& backend() const { return backend_; }

 private:
  bool reduces_natively(DType dtype, ReduceOp op) const;
  c10::intrusive_ptr<c10d::Work> issue(const CollectiveArgs& args);

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::atomic<int64_t> timeout_ms_;  // set from the caller's thread, read on the worker
  int rank_, size_;
  std::string library_;
};

}  // namespace hcomm
