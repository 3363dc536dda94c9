#include "core/executor.h"

#include "core/error.h"

namespace hcomm {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The message history() shows for a failed op (a record without it reads as
// a success).
std::string message_of(std::exception_ptr error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what()[0] ? e.what() : "hcomm: unknown error";
  } catch (...) {
    return "hcomm: unknown error";
  }
}
}  // namespace

Executor::Executor() : worker_(&Executor::work_loop, this) {}

Executor::~Executor() { shutdown(); }

std::shared_ptr<Request> Executor::submit(Task task, OpRecord record, uint64_t channel) {
  auto request = std::make_shared<Request>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw Error(ErrorKind::kRuntime, "hcomm: communicator was shut down; cannot run " +
                                                    std::string(op_name(record.kind)));
    queue_.push_back(Item{std::move(task), record, request, std::chrono::steady_clock::now(), nullptr, channel});
    ++in_flight_;
  }
  work_cv_.notify_one();
  return request;
}

std::shared_ptr<Request> Executor::try_direct(const DirectStart& start, OpRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || in_flight_ > 0) return nullptr;
  {
    // Issue order holds for direct ops too: a second one while the first is
    // still in the library goes through the queue, which waits for it (gloo
    // runs its async ops on two threads, so two in-place all_reduces of one
    // tensor would race there; NCCL orders them on its stream).
    std::lock_guard<std::mutex> dlock(direct_mu_);
    if (direct_in_flight_ > 0) return nullptr;
  }
  auto request = std::make_shared<Request>();
  auto begin = std::chrono::steady_clock::now();
  auto recorder = recorder_;
  {
    std::lock_guard<std::mutex> dlock(direct_mu_);
    ++direct_in_flight_;
  }
  auto done = [this, request, record, begin, recorder](std::exception_ptr error) mutable {
    record.seconds = seconds_since(begin);
    record.error = message_of(error);
    if (recorder) recorder(record);
    request->complete(error, record);
    std::lock_guard<std::mutex> dlock(direct_mu_);
    if (--direct_in_flight_ == 0) direct_cv_.notify_all();
  };
  auto undo = [this] {
    std::lock_guard<std::mutex> dlock(direct_mu_);
    if (--direct_in_flight_ == 0) direct_cv_.notify_all();
  };
  bool started = false;
  try {
    started = start(std::move(done));
  } catch (...) {
    undo();  // the library refused the op: nothing will call done
    throw;
  }
  if (!started) {
    undo();
    return nullptr;
  }
  return request;
}

bool Executor::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_ == 0;
}

void Executor::work_loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    {
      // An op issued after a direct op runs after it (see try_direct).
      std::unique_lock<std::mutex> dlock(direct_mu_);
      direct_cv_.wait(dlock, [&] { return direct_in_flight_ == 0; });
    }
    std::exception_ptr error;
    try {
      item.pending = item.task(item.record);
    } catch (...) {
      error = std::current_exception();
    }
    item.task = nullptr;  // drop captured buffers as soon as possible
    if (item.pending && !error) {
      post(std::move(item));
      continue;
    }
    finish(item, error);
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
  }
}

void Executor::post(Item item) {
  const uint64_t key = item.channel;
  std::lock_guard<std::mutex> lock(mu_);
  Channel& ch = channels_[key];
  ch.queue.push_back(std::move(item));
  if (ch.has_waiter) {
    channel_cv_.notify_all();  // a lingering waiter picks it up
    return;
  }
  ch.has_waiter = true;
  ++waiters_;
  std::thread([this, key] { drain(key); }).detach();
}

void Executor::drain(uint64_t key) {
  // How long an idle channel's thread waits for the next op before it ends.
  constexpr auto kLinger = std::chrono::milliseconds(20);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Channel& ch = channels_[key];
    if (ch.queue.empty()) {
      channel_cv_.wait_for(lock, kLinger, [&] { return stop_ || !channels_[key].queue.empty(); });
      if (channels_[key].queue.empty()) break;
      continue;
    }
    Item item = std::move(ch.queue.front());
    ch.queue.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      item.pending->wait();
      item.record.source_rank = item.pending->source();
    } catch (...) {
      error = std::current_exception();
    }
    item.pending.reset();
    finish(item, error);
    lock.lock();
    --in_flight_;
  }
  channels_.erase(key);
  // Under the lock: once shutdown() sees waiters_ == 0 this thread no longer
  // touches the executor.
  if (--waiters_ == 0) wait_cv_.notify_all();
}

void Executor::finish(Item& item, std::exception_ptr error) {
  item.record.seconds = seconds_since(item.start);
  item.record.error = message_of(error);
  if (recorder_) recorder_(item.record);
  item.request->complete(error, item.record);
}

void Executor::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  channel_cv_.notify_all();
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
  // Posted point-to-point ops and direct ops end by completing or by their
  // transport's timeout.
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_cv_.wait(lock, [&] { return waiters_ == 0; });
  }
  std::unique_lock<std::mutex> dlock(direct_mu_);
  direct_cv_.wait(dlock, [&] { return direct_in_flight_ == 0; });
}

}  // namespace hcomm
