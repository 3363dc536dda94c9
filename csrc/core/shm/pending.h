// The in-flight records of ShmTransport (shared between callers, the
// progress thread and the sender thread) and the Pending handles over them.
// Internal to shm_transport.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "core/error.h"
#include "core/shm/shm_transport.h"

namespace hcomm {

struct ShmTransport::RecvSlot {
  int peer, tag;
  void* data;
  size_t bytes;
  std::mutex mu;
  std::condition_variable cv;
  bool matched = false, done = false, cancelled = false;
  int source = -1;
  std::string error;
};

struct ShmTransport::Stashed {
  int source, tag;
  std::unique_ptr<uint8_t[]> data;  // not zero-filled: the payload overwrites it
  size_t bytes = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool complete = false;
};

struct ShmTransport::SendJob {
  int peer, tag;
  const void* data;
  size_t bytes;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::atomic<bool> cancel{false};
  std::exception_ptr error;
};

struct ShmTransport::Incoming {
  shm::RingHeader* ring = nullptr;
  bool in_message = false;
  shm::MessageHeader hdr{};
  size_t hdr_got = 0;
  uint64_t remaining = 0, offset = 0;
  std::shared_ptr<RecvSlot> slot;
  std::shared_ptr<Stashed> stash;
};

namespace {

struct DonePending final : Pending {
  void wait() override {}
};

// A receive that found its message already (being) stashed.
struct StashPending final : Pending {
  std::shared_ptr<ShmTransport::Stashed> msg;
  Buffer buf;
  std::chrono::milliseconds timeout;
  int rank;
  bool waited = false;
  void wait() override {
    if (waited) return;
    waited = true;
    std::unique_lock<std::mutex> l(msg->mu);
    if (!msg->cv.wait_for(l, timeout, [&] { return msg->complete; }))
      throw Error(ErrorKind::kTimeout, "hcomm shm: rank " + std::to_string(rank) + " timed out after " +
                                           std::to_string(timeout.count()) + " ms receiving the rest of a message from rank " +
                                           std::to_string(msg->source));
    if (msg->bytes != buf.bytes())
      throw Error(ErrorKind::kRuntime, "hcomm shm: rank " + std::to_string(rank) + " expected " +
                                           std::to_string(buf.bytes()) + " bytes from rank " + std::to_string(msg->source) +
                                           " (tag " + std::to_string(msg->tag) + ") but got " +
                                           std::to_string(msg->bytes));
    if (msg->bytes) std::memcpy(buf.data, msg->data.get(), msg->bytes);
  }
  int source() const override { return msg->source; }
};

}  // namespace

// A receive posted before its message arrived; the progress thread fills it.
class SlotPending final : public Pending {
 public:
  SlotPending(std::shared_ptr<ShmTransport::RecvSlot> slot, std::mutex* match_mu,
              std::deque<std::shared_ptr<ShmTransport::RecvSlot>>* posted, std::chrono::milliseconds timeout, int rank)
      : slot_(std::move(slot)), match_mu_(match_mu), posted_(posted), timeout_(timeout), rank_(rank) {}
  ~SlotPending() override {
    if (!waited_) cancel();  // never leave the progress thread a buffer that may be freed
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    {
      std::unique_lock<std::mutex> l(slot_->mu);
      if (slot_->cv.wait_for(l, timeout_, [&] { return slot_->done; })) {
        if (!slot_->error.empty()) throw Error(ErrorKind::kRuntime, slot_->error);
        return;
      }
    }
    if (cancel()) return;  // completed while we were cancelling
    throw Error(ErrorKind::kTimeout, "hcomm shm: rank " + std::to_string(rank_) + " timed out after " +
                                         std::to_string(timeout_.count()) + " ms waiting for a message from rank " +
                                         (slot_->peer < 0 ? std::string("any") : std::to_string(slot_->peer)) +
                                         " (tag " + std::to_string(slot_->tag) + ")");
  }
  int source() const override { return slot_->source; }

 private:
  // Withdraws the receive; true when it had completed after all.
  bool cancel() {
    {
      std::lock_guard<std::mutex> l(*match_mu_);
      auto it = std::find(posted_->begin(), posted_->end(), slot_);
      if (it != posted_->end()) posted_->erase(it);
    }
    std::lock_guard<std::mutex> l(slot_->mu);
    if (slot_->done && slot_->error.empty()) return true;
    slot_->cancelled = true;
    return false;
  }

  std::shared_ptr<ShmTransport::RecvSlot> slot_;
  std::mutex* match_mu_;
  std::deque<std::shared_ptr<ShmTransport::RecvSlot>>* posted_;
  std::chrono::milliseconds timeout_;
  int rank_;
  bool waited_ = false;
};

namespace {

struct JobPending final : Pending {
  std::shared_ptr<ShmTransport::SendJob> job;
  std::chrono::milliseconds timeout;
  bool waited = false;
  ~JobPending() override {
    if (waited) return;
    // The sender thread may be reading the caller's buffer: stop it and wait.
    job->cancel = true;
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->done; });
  }
  void wait() override {
    if (waited) return;
    waited = true;
    std::unique_lock<std::mutex> l(job->mu);
    // The sender thread has its own no-progress deadline; this one only
    // guards against a sender stuck behind other jobs.
    if (!job->cv.wait_for(l, 2 * timeout + std::chrono::seconds(1), [&] { return job->done; })) {
      job->cancel = true;
      job->cv.wait(l, [&] { return job->done; });
    }
    if (job->error) std::rethrow_exception(job->error);
  }
};

}  // namespace

}  // namespace hcomm
