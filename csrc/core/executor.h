// Runs one communicator's operations in issue order on a worker thread,
// never touching the GIL, and completes their requests.
//
// Issue order matters: every rank must run the same collectives in the same
// order on the same transports, and a single FIFO per group guarantees it.
// Point-to-point ops only *post* on the worker (their body returns the
// Pending); a second thread waits for them, so a rank can post a send and
// then a receive without the send's wait blocking the receive's post
// (batch_isend_irecv relies on this).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/request.h"
#include "core/transport.h"

namespace hcomm {

class Executor {
 public:
  // A task runs on the worker; it may fill `record` and may return a Pending
  // to be waited for off the worker (nullptr when it finished its work).
  using Task = std::function<std::unique_ptr<Pending>(OpRecord& record)>;

  Executor();
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  std::shared_ptr<Request> submit(Task task, OpRecord record);
  // Stops accepting work, fails what is queued, joins the threads.
  void shutdown();
  bool idle() const;
  // Called with each op's record just before its request completes.
  void set_recorder(std::function<void(const OpRecord&)> recorder) { recorder_ = std::move(recorder); }

 private:
  struct Item {
    Task task;
    OpRecord record;
    std::shared_ptr<Request> request;
    std::chrono::steady_clock::time_point start;
    std::unique_ptr<Pending> pending;
  };
  void work_loop();
  void finish(Item& item, std::exception_ptr error);
  void wait_loop();

  mutable std::mutex mu_;
  std::condition_variable work_cv_, wait_cv_;
  std::deque<Item> queue_;
  std::deque<Item> posted_;
  size_t in_flight_ = 0;
  bool stop_ = false;
  bool worker_done_ = false;
  std::function<void(const OpRecord&)> recorder_;
  std::thread worker_, waiter_;
};

}  // namespace hcomm
