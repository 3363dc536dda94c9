// HCommWork: the c10d::Work torch sees for an hcomm op.  Wraps core
// Requests; getFuture() (which DDP needs) completes when they do.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <vector>

#include "core/request.h"

namespace hcomm {

class HCommWork final : public c10d::Work {
 public:
  // `requests` may hold several core ops (coalesced calls); `outputs` is the
  // future's value.  `timeout` applies when wait() is called without one.
  HCommWork(std::vector<std::shared_ptr<Request>> requests, c10d::OpType type, std::vector<at::Tensor> outputs,
            std::chrono::milliseconds timeout, int rank, const char* title);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;
  void synchronize() override {}
  void abort() override {}

  const std::vector<std::shared_ptr<Request>>& requests() const { return requests_; }

 private:
  std::vector<std::shared_ptr<Request>> requests_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  int rank_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Rethrows a core failure as the c10 error type that becomes the right
// Python exception (ValueError for bad arguments, DistBackendError otherwise).
[[noreturn]] void rethrow_for_torch(std::exception_ptr error);

}  // namespace hcomm
