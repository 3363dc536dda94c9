#include "torch/work.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <atomic>

#include "core/error.h"

namespace hcomm {

void rethrow_for_torch(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInvalidArgument) TORCH_CHECK_VALUE(false, e.what());
    C10_THROW_ERROR(DistBackendError, e.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, std::string("hcomm: ") + e.what());
  }
}

HCommWork::HCommWork(std::vector<std::shared_ptr<Request>> requests, c10d::OpType type,
                     std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout, int rank, const char* title)
    : c10d::Work(rank, type, title),
      requests_(std::move(requests)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      rank_(rank) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  // The future completes when the last request does, with the first error.
  struct Join {
    std::atomic<size_t> left;
    std::mutex mu;
    std::exception_ptr first;
  };
  auto join = std::make_shared<Join>();
  join->left = requests_.size();
  auto future = future_;
  auto outputs_copy = outputs_;
  if (requests_.empty()) {
    future_->markCompleted(c10::IValue(outputs_copy));
    return;
  }
  for (auto& req : requests_) {
    req->on_complete([join, future, outputs_copy](std::exception_ptr err) {
      if (err) {
        std::lock_guard<std::mutex> lock(join->mu);
        if (!join->first) join->first = err;
      }
      if (--join->left == 0) {
        if (join->first) {
          try {
            rethrow_for_torch(join->first);
          } catch (...) {
            future->setError(std::current_exception());
          }
        } else {
          future->markCompleted(c10::IValue(outputs_copy));
        }
      }
    });
  }
}

bool HCommWork::isCompleted() {
  for (auto& r : requests_)
    if (!r->completed()) return false;
  return true;
}

bool HCommWork::isSuccess() const {
  for (auto& r : requests_)
    if (!r->completed() || r->error()) return false;
  return true;
}

std::exception_ptr HCommWork::exception() const {
  for (auto& r : requests_)
    if (auto e = r->error()) return e;
  return nullptr;
}

bool HCommWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (auto& r : requests_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool done = false;
    try {
      done = r->wait(std::max(left, std::chrono::milliseconds(0)));
    } catch (...) {
      rethrow_for_torch(std::current_exception());
    }
    if (!done) {
      // Name who had not answered where hcomm knows (its own algorithms and
      // the HCOMM_DEBUG exchange wait on one peer at a time); a library's
      // native collective does not say.
      const std::string peers = r->waiting_for();
      C10_THROW_ERROR(DistBackendError,
                      "hcomm: rank " + std::to_string(rank_) + " timed out after " + std::to_string(limit.count()) +
                          " ms waiting for " + c10d::opTypeToString(retrieveOpType()) +
                          (peers.empty() ? std::string(" (inside the library's native collective, which does not say "
                                                       "which rank is missing; HCOMM_DEBUG=1 checks every call first)")
                                         : "; still waiting for " + peers));
    }
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> HCommWork::getFuture() { return future_; }

int HCommWork::sourceRank() const {
  if (requests_.empty()) return -1;
  return requests_.front()->record().source_rank;
}

}  // namespace hcomm
