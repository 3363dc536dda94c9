#include "core/request.h"

namespace hcomm {

bool Request::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout.count() < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Request::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::exception_ptr Request::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

OpRecord Request::record() const {
  std::lock_guard<std::mutex> lock(mu_);
  return record_;
}

void Request::set_watch(std::shared_ptr<const PeerWatch> watch) {
  std::lock_guard<std::mutex> lock(mu_);
  watch_ = std::move(watch);
}

std::string Request::waiting_for() const {
  std::shared_ptr<const PeerWatch> watch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch = watch_;
  }
  return watch ? watch->describe() : std::string();
}

void Request::on_complete(Callback cb) {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      callbacks_.push_back(std::move(cb));
      return;
    }
    err = error_;
  }
  cb(err);
}

void Request::complete(std::exception_ptr error, const OpRecord& record) {
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
    record_ = record;
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  // Outside the lock: a callback may inspect the request or queue more work.
  for (auto& cb : callbacks) cb(error);
}

}  // namespace hcomm
